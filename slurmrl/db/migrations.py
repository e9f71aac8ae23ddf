"""Numbered schema migrations of the colocation DB, tracked in `PRAGMA user_version`.

Migration N brings the schema from version N-1 to N; each runs in its own transaction
together with the `user_version` bump, so a crash mid-upgrade leaves the old version.
Append new migrations; never edit a released one. A DB whose version is newer than this
slurmrl knows is refused (an older controller must not write a newer schema).

Times are UTC epoch seconds (REAL) in `*_at` columns; GPU sets are JSON arrays of pool
GPU indices; `lease_gpus` has one row per hold of a GPU by a lease (from its grant or a
grow to a shrink or the lease's end) so that the no-overlap invariant can be checked
from the DB alone.
"""

from __future__ import annotations

MIGRATIONS: tuple[str, ...] = (
    # 1: the initial schema
    """
    CREATE TABLE pools (
        pool_id INTEGER PRIMARY KEY AUTOINCREMENT,
        slurm_job_id INTEGER,             -- the pinned allocation hosting the pool
        partition TEXT NOT NULL DEFAULT '',
        nodes TEXT NOT NULL DEFAULT '[]', -- JSON list of node names
        gpus INTEGER NOT NULL,            -- G: pool GPU indices are 0..G-1
        gpu_indices TEXT NOT NULL DEFAULT '[]', -- JSON: physical GPU index of each pool GPU
        state TEXT NOT NULL,              -- pending | open | closed
        dedicated INTEGER NOT NULL DEFAULT 0,
        reason TEXT NOT NULL DEFAULT '',
        opened_at REAL NOT NULL,
        closed_at REAL
    );
    CREATE TABLE groups (
        group_id INTEGER PRIMARY KEY AUTOINCREMENT,
        pool_id INTEGER NOT NULL REFERENCES pools(pool_id),
        created_at REAL NOT NULL,
        dissolved_at REAL
    );
    CREATE TABLE jobs (
        job_id INTEGER PRIMARY KEY,       -- the Slurm job id of the driver
        user TEXT NOT NULL,
        uid INTEGER NOT NULL,
        name TEXT NOT NULL DEFAULT '',
        partition TEXT NOT NULL DEFAULT '',
        request TEXT NOT NULL,            -- JSON RlRequest
        state TEXT NOT NULL,              -- JobState code: PD R CD F CA
        reason TEXT NOT NULL DEFAULT '',
        pool_id INTEGER REFERENCES pools(pool_id),
        group_id INTEGER REFERENCES groups(group_id),
        pool_gpus TEXT NOT NULL DEFAULT '[]', -- JSON: pool GPU index of each job-local GPU
        phase TEXT,                       -- phase the driver is in now (last reported)
        secret TEXT NOT NULL DEFAULT '',  -- data-plane secret, never shown to other users
        registered_at REAL NOT NULL,
        ended_at REAL
    );
    CREATE INDEX jobs_state ON jobs(state);
    CREATE INDEX jobs_uid ON jobs(uid);
    CREATE TABLE services (
        service_id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER NOT NULL REFERENCES jobs(job_id),
        pool_id INTEGER REFERENCES pools(pool_id),
        role TEXT NOT NULL,               -- rollout | trainer
        backend TEXT NOT NULL DEFAULT '',
        step_id TEXT,
        gpus TEXT NOT NULL DEFAULT '[]',  -- JSON pool GPU indices it is pinned to
        address TEXT NOT NULL DEFAULT '',
        residency TEXT NOT NULL DEFAULT 'stopped',
        state TEXT NOT NULL DEFAULT 'starting',
        started_at REAL NOT NULL,
        ended_at REAL
    );
    CREATE INDEX services_job ON services(job_id);
    CREATE TABLE leases (
        lease_id INTEGER PRIMARY KEY AUTOINCREMENT, -- also the phase request's id
        pool_id INTEGER NOT NULL REFERENCES pools(pool_id),
        job_id INTEGER NOT NULL REFERENCES jobs(job_id),
        phase TEXT NOT NULL,
        wanted TEXT NOT NULL,             -- JSON pool GPU indices requested
        gpus TEXT NOT NULL DEFAULT '[]',  -- JSON pool GPU indices held now (after shrinks)
        min_gpus INTEGER NOT NULL,
        state TEXT NOT NULL,              -- LeaseState
        reason TEXT NOT NULL DEFAULT '',
        requested_at REAL NOT NULL,
        granted_at REAL,
        released_at REAL,                 -- released, revoked or cancelled at
        deadline_at REAL NOT NULL
    );
    CREATE INDEX leases_open ON leases(state) WHERE state IN ('waiting', 'held');
    CREATE INDEX leases_job ON leases(job_id);
    CREATE TABLE lease_gpus (
        lease_id INTEGER NOT NULL REFERENCES leases(lease_id),
        pool_id INTEGER NOT NULL,
        gpu INTEGER NOT NULL,
        start_at REAL NOT NULL,
        end_at REAL,                      -- NULL while held
        PRIMARY KEY (lease_id, gpu)
    );
    CREATE INDEX lease_gpus_open ON lease_gpus(pool_id, gpu) WHERE end_at IS NULL;
    CREATE TABLE observations (
        observation_id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER NOT NULL REFERENCES jobs(job_id),
        phase TEXT NOT NULL,
        lease_id INTEGER REFERENCES leases(lease_id), -- NULL for gaps (reward, idle)
        requested_at REAL,
        granted_at REAL,
        released_at REAL,
        busy_s REAL,                      -- the driver's own measure of the phase's work
        gpus INTEGER NOT NULL DEFAULT 0,
        detail TEXT NOT NULL DEFAULT '{}' -- JSON timing the driver reported
    );
    CREATE INDEX observations_job ON observations(job_id, observation_id);
    CREATE TABLE ledger (
        entry_id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER NOT NULL REFERENCES jobs(job_id),
        lease_id INTEGER REFERENCES leases(lease_id),
        pool_id INTEGER,
        gpu_seconds REAL NOT NULL,        -- GPU-seconds granted (held) by this lease
        at REAL NOT NULL
    );
    CREATE INDEX ledger_job ON ledger(job_id);
    """,
    # 2: NVML readings of a lease's GPUs, taken by its services on the pool's node
    """
    CREATE TABLE lease_readings (
        reading_id INTEGER PRIMARY KEY AUTOINCREMENT,
        lease_id INTEGER NOT NULL REFERENCES leases(lease_id),
        job_id INTEGER NOT NULL REFERENCES jobs(job_id),
        role TEXT NOT NULL,               -- the service that read its GPUs
        at REAL NOT NULL,
        reading TEXT NOT NULL             -- JSON: {"nvml": "ok", "gpus": [...]} or a no-GPU marker
    );
    CREATE INDEX lease_readings_lease ON lease_readings(lease_id);
    """,
    # 3: a lease that grows may take back a GPU it shrank away from earlier: one row per
    # hold, keyed by its start too
    """
    CREATE TABLE lease_gpus_3 (
        lease_id INTEGER NOT NULL REFERENCES leases(lease_id),
        pool_id INTEGER NOT NULL,
        gpu INTEGER NOT NULL,
        start_at REAL NOT NULL,
        end_at REAL,                      -- NULL while held
        PRIMARY KEY (lease_id, gpu, start_at)
    );
    INSERT INTO lease_gpus_3 SELECT lease_id, pool_id, gpu, start_at, end_at FROM lease_gpus;
    DROP TABLE lease_gpus;
    ALTER TABLE lease_gpus_3 RENAME TO lease_gpus;
    CREATE INDEX lease_gpus_open ON lease_gpus(pool_id, gpu) WHERE end_at IS NULL;
    """,
    # 4: the controller's own key to a service's park, activate and stop (never the
    # job's driver's); NULL for a service started before it, opened by the job's secret
    """
    ALTER TABLE services ADD COLUMN control_secret TEXT;
    """,
    # 5: floating pools: a pool of whole windows, each its own Slurm allocation on the
    # pool's node (window 0 is the pool's own `slurm_job_id`)
    """
    ALTER TABLE pools ADD COLUMN floating INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE pool_windows (
        window_id INTEGER PRIMARY KEY AUTOINCREMENT,
        pool_id INTEGER NOT NULL REFERENCES pools(pool_id),
        window INTEGER NOT NULL,          -- its pool GPUs: window * G .. window * G + G - 1
        slurm_job_id INTEGER NOT NULL,    -- the allocation holding its GPUs
        gpu_indices TEXT NOT NULL,        -- JSON: Slurm's GPU index of each, on the node
        opened_at REAL NOT NULL,
        closed_at REAL                    -- NULL while open
    );
    CREATE INDEX pool_windows_open ON pool_windows(pool_id) WHERE closed_at IS NULL;
    """,
    # 6: a floating pool's window may be on another node than the pool's own
    # (`slurm.floating_across_nodes`); NULL: the pool's node
    """
    ALTER TABLE pool_windows ADD COLUMN node TEXT;
    """,
    # 7: what the controller of this DB is called: a random tag it writes into the
    # comment of each Slurm allocation it opens, so that it can tell its own from
    # another controller's (`controller.pools.PoolAllocator.strays`)
    """
    CREATE TABLE meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    """,
    # 8: the hand-off directory a floating member's copy was started with: a copy
    # started later on its node takes the same one, whatever the controller's version or
    # `services.handoff_dir` by then; NULL: none, or started before this
    """
    ALTER TABLE services ADD COLUMN handoff_dir TEXT;
    """,
    # 9: the Slurm start time of the run of the job that registered it: a later run
    # (after a requeue) starts at another time; NULL: Slurm did not say, or registered
    # before this
    """
    ALTER TABLE jobs ADD COLUMN slurm_started_at REAL;
    """,
)

LATEST = len(MIGRATIONS)
