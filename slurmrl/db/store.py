"""The colocation DB: one `Store` over SQLite (WAL), the only code that writes SQL.

Every state change of the controller is one transaction (`with store.transaction():`),
so the DB alone is enough to restart from. Transactions nest: an inner block joins the
outer one. `synchronous=NORMAL` in WAL mode survives a process crash (`kill -9`) without
losing a committed transaction; only a power loss may drop the last ones (SQLite's
documented trade-off), which costs at most a lease that a restart then revokes.

Known limits: one writer process (the controller); readers (`slurmrl status` reads
through the controller's RPC, not the file; `slurmrl report` opens it `read_only`). Not
thread-safe: use it from one thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlite_utils

from slurmrl.db.migrations import LATEST, MIGRATIONS
from slurmrl.db.records import (
    GroupRecord,
    JobRecord,
    LeaseRecord,
    ObservationRecord,
    PoolRecord,
    ServiceRecord,
    WindowRecord,
    ints,
    request_from_json,
    request_to_json,
)
from slurmrl.leases.invariants import Interval
from slurmrl.leases.types import Lease, PhaseRequest
from slurmrl.model import JobState, LeaseState, Phase


class StoreError(RuntimeError):
    """The DB cannot be used (newer schema, unknown id...)."""


#: the tables of every schema version (migration 1), which the read API uses
_TABLES = frozenset({"pools", "groups", "jobs", "services", "leases", "lease_gpus",
                     "observations", "ledger"})


log = logging.getLogger(__name__)


def _private(path: str) -> None:
    """Make the DB file (created if missing) and SQLite's side files owner-only: it holds
    every job's secret, which signs calls to that job's services. SQLite gives the `-wal`
    and `-shm` files it creates the DB file's mode."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for side in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(path + side, 0o600)


def _open_read_only(path: str) -> sqlite3.Connection:
    """A connection that cannot write to the DB at `path` (mode=ro: SQLite itself refuses
    every write, a checkpoint's included).

    Reading a WAL-mode DB needs its `-shm` file, which SQLite creates beside the DB: in a
    directory the reader may not write to, a DB with no `-wal` file (its log checkpointed,
    no writer open) is read as immutable instead; with a `-wal`, whose last transactions
    only the `-shm` can index, it is refused by a `StoreError` saying what to do."""
    real = Path(path).resolve()  # a link's target: its directory and -wal are the DB's
    uri = real.as_uri()

    def connect(params: str) -> sqlite3.Connection:
        return sqlite3.connect(f"{uri}?{params}", uri=True, isolation_level=None,
                               check_same_thread=False)

    conn = connect("mode=ro")
    try:
        conn.execute("PRAGMA user_version").fetchone()
    except sqlite3.DatabaseError as exc:
        # without a -wal SQLite says READONLY_DIRECTORY, with one CANTOPEN
        no_shm = getattr(exc, "sqlite_errorname", "") in {"SQLITE_READONLY_DIRECTORY",
                                                           "SQLITE_CANTOPEN"}
        if not no_shm or os.access(real.parent, os.W_OK):
            return conn  # not a DB, damaged...: the schema check names it
        conn.close()
        if Path(f"{real}-wal").exists():
            raise StoreError(
                f"cannot read {path}: its directory is not writable and SQLite needs to "
                f"create {path}-shm there to read {path}-wal; copy the DB (with its -wal "
                "file) somewhere writable") from None
        return connect("mode=ro&immutable=1")
    return conn


def _gpus(g: Iterable[int]) -> str:
    return json.dumps(sorted(g))


class Store:
    """The colocation database of one controller."""

    def __init__(self, path: str | Path, *, read_only: bool = False) -> None:
        """`read_only`: read an existing DB without ever writing to it (`slurmrl report`):
        it is not created, migrated nor switched to WAL, an older schema is read as it is,
        and a file without the slurmrl schema raises `StoreError`. Reading a WAL-mode DB
        may leave SQLite's empty `-wal`/`-shm` side files next to it."""
        self.path = str(path)
        if read_only:
            self.conn = _open_read_only(self.path)
        else:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
                _private(self.path)
            # isolation_level=None: we issue BEGIN/COMMIT ourselves (explicit transactions).
            self.conn = sqlite3.connect(self.path, isolation_level=None,
                                        check_same_thread=False)
        self.db = sqlite_utils.Database(self.conn)
        self._checkpointer: threading.Thread | None = None
        self._closing = threading.Event()
        self._depth = 0
        self._committed: list[Callable[[], None]] = []  #: `after_commit` of the one under way
        self._rolled_back: list[Callable[[], None]] = []  #: its `on_rollback`
        try:
            if not read_only:
                self.conn.execute("PRAGMA journal_mode=WAL")
                self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.execute("PRAGMA foreign_keys=ON")
            self.conn.execute("PRAGMA busy_timeout=5000")
            if read_only:
                self._check_schema()
            else:
                self.migrate()
        except sqlite3.DatabaseError as exc:  # e.g. "file is not a database": name it
            self.conn.close()
            raise StoreError(f"cannot open the colocation DB {self.path}: {exc}") from None
        except BaseException:
            self.conn.close()
            raise

    def close(self) -> None:
        self._closing.set()
        if self._checkpointer is not None:
            self._checkpointer.join()
        self.conn.close()

    def checkpoint_in_background(self, interval_s: float = 1.0) -> None:
        """Move WAL checkpoints (which fsync) off the writer's thread.

        The controller calls this: its event loop then never waits for a checkpoint's
        fsync inside a lease operation. A second connection checkpoints passively every
        `interval_s`; automatic checkpoints on the writer are turned off.
        """
        if self.path == ":memory:" or self._checkpointer is not None:
            return
        self.conn.execute("PRAGMA wal_autocheckpoint=0")

        def run() -> None:
            conn = sqlite3.connect(self.path, check_same_thread=False)
            try:
                while not self._closing.wait(interval_s):
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            finally:
                conn.close()

        self._checkpointer = threading.Thread(target=run, name="slurmrl-db-checkpoint",
                                              daemon=True)
        self._checkpointer.start()

    # -- schema ----------------------------------------------------------------------
    def controller_tag(self) -> str:
        """This DB's controller tag: 16 random hex digits, made once and kept."""
        with self.transaction():
            self._x("INSERT OR IGNORE INTO meta (key, value) VALUES ('controller_tag', ?)",
                    (secrets.token_hex(8),))
            return str(self._q("SELECT value FROM meta WHERE key = 'controller_tag'"
                               )[0]["value"])

    @property
    def version(self) -> int:
        return int(self.conn.execute("PRAGMA user_version").fetchone()[0])

    def migrate(self) -> None:
        current = self.version
        self._refuse_newer(current)
        for number in range(current + 1, LATEST + 1):
            with self.transaction():
                for statement in _statements(MIGRATIONS[number - 1]):
                    self.conn.execute(statement)
                self.conn.execute(f"PRAGMA user_version = {number}")

    def _check_schema(self) -> None:
        """Refuse a file that is not a slurmrl DB, or whose schema is newer than ours."""
        try:
            current = self.version
            tables = {r[0] for r in self.conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.OperationalError as exc:  # SQLite, but unreadable here
            raise StoreError(f"cannot open {self.path}: {exc}") from None
        except sqlite3.DatabaseError as exc:  # not SQLite at all: "file is not a database"
            raise StoreError(f"{self.path} is not a slurmrl colocation DB ({exc})") from None
        if current == 0 or not _TABLES.issubset(tables):
            raise StoreError(f"{self.path} is not a slurmrl colocation DB (it has no "
                             "slurmrl schema)")
        self._refuse_newer(current)

    def _refuse_newer(self, current: int) -> None:
        if current > LATEST:
            raise StoreError(
                f"{self.path} has schema version {current}, newer than this slurmrl "
                f"knows ({LATEST}); upgrade slurmrl"
            )

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One atomic state change; nested blocks join the outermost one. What its
        callers registered runs once the outermost block ends: `after_commit` actions
        after its COMMIT, `on_rollback` ones (newest first) after its ROLLBACK."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self.conn.execute("BEGIN IMMEDIATE")
        self._depth = 1
        self._committed, self._rolled_back = [], []
        try:
            yield
            self._depth = 0
            self.conn.execute("COMMIT")
        except BaseException:
            self._depth = 0
            self._roll_back()
            raise
        done, self._committed, self._rolled_back = self._committed, [], []
        for fn in done:  # each: one that fails must not keep the others from being told
            try:
                fn()
            except Exception:
                log.exception("an action after a commit failed (the change is committed)")

    def _roll_back(self) -> None:
        """End the failed transaction and undo what memory changed with it (newest
        first). SQLite may have rolled back itself (disk full, I/O error): memory
        still must."""
        undo, self._committed, self._rolled_back = self._rolled_back, [], []
        with contextlib.suppress(sqlite3.Error):
            self.conn.execute("ROLLBACK")
        for fn in reversed(undo):
            fn()

    def after_commit(self, fn: Callable[[], None]) -> None:
        """Run `fn` once the transaction under way commits (at once outside one); never
        if it rolls back: telling anyone of a change the DB does not keep."""
        if self._depth:
            self._committed.append(fn)
        else:
            fn()

    def on_rollback(self, fn: Callable[[], None]) -> None:
        """Run `fn` if the transaction under way rolls back: memory that changed with
        it goes back as the DB does. Only inside a transaction."""
        if not self._depth:
            raise RuntimeError("on_rollback outside a transaction")
        self._rolled_back.append(fn)

    def _q(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        cur = self.conn.execute(sql, params)
        cols = [d[0] for d in cur.description or ()]
        return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]

    def _x(self, sql: str, params: Sequence[Any] = ()) -> int:
        with self.transaction():
            cur = self.conn.execute(sql, params)
        return int(cur.lastrowid or 0)

    # -- jobs ------------------------------------------------------------------------
    def add_job(self, job: JobRecord) -> None:
        self._x(
            "INSERT INTO jobs (job_id, user, uid, name, partition, request, state, reason,"
            " pool_id, group_id, pool_gpus, phase, secret, registered_at, ended_at,"
            " slurm_started_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (job.job_id, job.user, job.uid, job.name, job.partition,
             request_to_json(job.request), str(job.state), job.reason, job.pool_id,
             job.group_id, json.dumps(list(job.pool_gpus)), job.phase, job.secret,
             job.registered_at, job.ended_at, job.slurm_started_at),
        )

    def job(self, job_id: int) -> JobRecord | None:
        rows = self._q("SELECT * FROM jobs WHERE job_id = ?", (job_id,))
        return _job(rows[0]) if rows else None

    def jobs(
        self,
        *,
        active: bool | None = None,
        user: str | None = None,
        ids: Sequence[int] | None = None,
        pool_id: int | None = None,
    ) -> list[JobRecord]:
        """Jobs by filter; `active=True` means not in a terminal state."""
        where: list[str] = []
        params: list[Any] = []
        if active is not None:
            terminal = [str(s) for s in JobState if s.terminal]
            op = "NOT IN" if active else "IN"
            where.append(f"state {op} ({','.join('?' * len(terminal))})")
            params += terminal
        if user is not None:
            where.append("user = ?")
            params.append(user)
        if ids is not None:
            where.append(f"job_id IN ({','.join('?' * len(ids))})")
            params += list(ids)
        if pool_id is not None:
            where.append("pool_id = ?")
            params.append(pool_id)
        sql = "SELECT * FROM jobs" + (" WHERE " + " AND ".join(where) if where else "")
        return [_job(r) for r in self._q(sql + " ORDER BY job_id", params)]

    def count_jobs(self) -> int:
        return int(self.db["jobs"].count)

    def count_jobs_by_state(self) -> dict[str, int]:
        """{state code (`JobState` value): jobs in it}; states with none are absent."""
        rows = self._q("SELECT state, COUNT(*) AS n FROM jobs GROUP BY state")
        return {str(r["state"]): int(r["n"]) for r in rows}

    def update_job(self, job_id: int, **fields: Any) -> None:
        """Change columns of a job (`state`, `reason`, `pool_id`, `phase`, ...)."""
        allowed = {"state", "reason", "pool_id", "group_id", "pool_gpus", "phase",
                   "ended_at", "name", "secret"}
        bad = set(fields) - allowed
        if bad:
            raise StoreError(f"cannot update job columns {sorted(bad)}")
        if not fields:
            return
        values = [
            json.dumps(list(v)) if k == "pool_gpus" else (str(v) if k == "state" else v)
            for k, v in fields.items()
        ]
        sets = ", ".join(f"{k} = ?" for k in fields)
        self._x(f"UPDATE jobs SET {sets} WHERE job_id = ?", (*values, job_id))

    # -- pools and groups ----------------------------------------------------------------
    def add_pool(
        self, *, gpus: int, opened_at: float, state: str = "open",
        slurm_job_id: int | None = None, partition: str = "", nodes: Sequence[str] = (),
        gpu_indices: Sequence[int] = (), dedicated: bool = False, reason: str = "",
        floating: bool = False,
    ) -> int:
        return self._x(
            "INSERT INTO pools (slurm_job_id, partition, nodes, gpus, gpu_indices, state,"
            " dedicated, reason, opened_at, floating) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (slurm_job_id, partition, json.dumps(list(nodes)), gpus,
             json.dumps(list(gpu_indices)), state, int(dedicated), reason, opened_at,
             int(floating)),
        )

    def pool(self, pool_id: int) -> PoolRecord | None:
        rows = self._q("SELECT * FROM pools WHERE pool_id = ?", (pool_id,))
        return _pool(rows[0]) if rows else None

    def pools(self, *, open_only: bool = False) -> list[PoolRecord]:
        sql = "SELECT * FROM pools" + (" WHERE state != 'closed'" if open_only else "")
        return [_pool(r) for r in self._q(sql + " ORDER BY pool_id")]

    def update_pool(self, pool_id: int, **fields: Any) -> None:
        allowed = {"state", "reason", "closed_at", "slurm_job_id", "nodes", "gpu_indices",
                   "gpus"}
        bad = set(fields) - allowed
        if bad:
            raise StoreError(f"cannot update pool columns {sorted(bad)}")
        values = [json.dumps(list(v)) if k in ("nodes", "gpu_indices") else v
                  for k, v in fields.items()]
        sets = ", ".join(f"{k} = ?" for k in fields)
        self._x(f"UPDATE pools SET {sets} WHERE pool_id = ?", (*values, pool_id))

    def add_window(self, *, pool_id: int, window: int, slurm_job_id: int,
                   gpu_indices: Sequence[int], opened_at: float,
                   node: str | None = None) -> int:
        """Record an open window of a floating pool (`node`: where, if not the pool's)."""
        return self._x(
            "INSERT INTO pool_windows (pool_id, window, slurm_job_id, gpu_indices, opened_at,"
            " node) VALUES (?,?,?,?,?,?)",
            (pool_id, window, slurm_job_id, json.dumps(list(gpu_indices)), opened_at, node))

    def windows(self, pool_id: int, *, open_only: bool = True) -> list[WindowRecord]:
        """A floating pool's windows, by window number (open ones only by default)."""
        sql = "SELECT * FROM pool_windows WHERE pool_id = ?" + (
            " AND closed_at IS NULL" if open_only else "")
        return [WindowRecord(window_id=r["window_id"], pool_id=r["pool_id"],
                             window=r["window"], slurm_job_id=r["slurm_job_id"],
                             gpu_indices=ints(r["gpu_indices"]), opened_at=r["opened_at"],
                             # `node` came with schema 6; a report reads older ones
                             closed_at=r["closed_at"],
                             node=r.get("node"))
                for r in self._q(sql + " ORDER BY window, window_id", (pool_id,))]

    def pool_gpu_seconds(self, pool: PoolRecord, now: float) -> float:
        """GPU-seconds Slurm allocated to the pool until it closed (or `now`): its GPUs
        times its life, or for a floating pool each window's GPUs times that window's."""
        end = pool.closed_at if pool.closed_at is not None else now
        if not pool.floating:
            return pool.gpus * max(0.0, end - pool.opened_at)
        return sum(len(w.gpu_indices) * max(0.0, (w.closed_at if w.closed_at is not None
                                                  else end) - w.opened_at)
                   for w in self.windows(pool.pool_id, open_only=False))

    def close_window(self, window_id: int, at: float) -> None:
        self._x("UPDATE pool_windows SET closed_at = ? WHERE window_id = ?", (at, window_id))

    def add_group(self, pool_id: int, created_at: float) -> int:
        return self._x("INSERT INTO groups (pool_id, created_at) VALUES (?, ?)",
                       (pool_id, created_at))

    def groups(self, *, pool_id: int | None = None) -> list[GroupRecord]:
        sql, params = "SELECT * FROM groups", list[Any]()
        if pool_id is not None:
            sql, params = sql + " WHERE pool_id = ?", [pool_id]
        return [GroupRecord(**r) for r in self._q(sql + " ORDER BY group_id", params)]

    def dissolve_group(self, group_id: int, at: float) -> None:
        self._x("UPDATE groups SET dissolved_at = ? WHERE group_id = ?", (at, group_id))

    # -- services --------------------------------------------------------------------------
    def add_service(
        self, *, job_id: int, role: str, started_at: float, pool_id: int | None = None,
        backend: str = "", gpus: Sequence[int] = (), state: str = "starting",
        handoff_dir: str | None = None,
    ) -> int:
        return self._x(
            "INSERT INTO services (job_id, pool_id, role, backend, gpus, state, started_at,"
            " handoff_dir) VALUES (?,?,?,?,?,?,?,?)",
            (job_id, pool_id, role, backend, _gpus(gpus), state, started_at, handoff_dir),
        )

    def update_service(self, service_id: int, **fields: Any) -> None:
        allowed = {"step_id", "address", "residency", "state", "ended_at", "gpus", "pool_id",
                   "control_secret"}
        bad = set(fields) - allowed
        if bad:
            raise StoreError(f"cannot update service columns {sorted(bad)}")
        values = [_gpus(v) if k == "gpus" else v for k, v in fields.items()]
        sets = ", ".join(f"{k} = ?" for k in fields)
        self._x(f"UPDATE services SET {sets} WHERE service_id = ?", (*values, service_id))

    def services(
        self, *, job_id: int | None = None, pool_id: int | None = None,
        live_only: bool = False,
    ) -> list[ServiceRecord]:
        where: list[str] = []
        params: list[Any] = []
        if job_id is not None:
            where.append("job_id = ?")
            params.append(job_id)
        if pool_id is not None:
            where.append("pool_id = ?")
            params.append(pool_id)
        if live_only:
            where.append("ended_at IS NULL")
        sql = "SELECT * FROM services" + (" WHERE " + " AND ".join(where) if where else "")
        out = []
        for r in self._q(sql + " ORDER BY service_id", params):
            r["gpus"] = ints(r["gpus"])
            out.append(ServiceRecord(**r))
        return out

    # -- leases ------------------------------------------------------------------------------
    def add_request(
        self, *, pool_id: int, job_id: int, phase: Phase, wanted: Iterable[int],
        min_gpus: int, requested_at: float, deadline_at: float,
    ) -> int:
        """Persist a new waiting phase request; its id is the lease id it may become."""
        return self._x(
            "INSERT INTO leases (pool_id, job_id, phase, wanted, min_gpus, state,"
            " requested_at, deadline_at) VALUES (?,?,?,?,?,?,?,?)",
            (pool_id, job_id, str(phase), _gpus(wanted), min_gpus,
             str(LeaseState.WAITING), requested_at, deadline_at),
        )

    def lease_granted(self, pool_id: int, lease: Lease) -> None:
        with self.transaction():
            self.conn.execute(
                "UPDATE leases SET state = ?, gpus = ?, granted_at = ?, deadline_at = ?"
                " WHERE lease_id = ?",
                (str(LeaseState.HELD), _gpus(lease.gpus), lease.granted_at,
                 lease.deadline_at, lease.lease_id),
            )
            self.conn.executemany(
                "INSERT INTO lease_gpus (lease_id, pool_id, gpu, start_at) VALUES (?,?,?,?)",
                [(lease.lease_id, pool_id, g, lease.granted_at) for g in sorted(lease.gpus)],
            )

    def lease_shrunk(self, lease: Lease, freed: Iterable[int], at: float) -> None:
        with self.transaction():
            self.conn.execute("UPDATE leases SET gpus = ? WHERE lease_id = ?",
                              (_gpus(lease.gpus), lease.lease_id))
            self.conn.executemany(
                "UPDATE lease_gpus SET end_at = ? WHERE lease_id = ? AND gpu = ?"
                " AND end_at IS NULL",
                [(at, lease.lease_id, g) for g in freed],
            )

    def lease_grown(self, pool_id: int, lease: Lease, added: Iterable[int], at: float) -> None:
        with self.transaction():
            self.conn.execute("UPDATE leases SET gpus = ? WHERE lease_id = ?",
                              (_gpus(lease.gpus), lease.lease_id))
            self.conn.executemany(
                "INSERT INTO lease_gpus (lease_id, pool_id, gpu, start_at) VALUES (?,?,?,?)",
                [(lease.lease_id, pool_id, g, at) for g in sorted(added)],
            )

    def lease_ended(
        self, lease_id: int, state: LeaseState, at: float, reason: str = "",
        gpu_s: float | None = None,
    ) -> float:
        """A held lease was released or revoked, or a waiting request cancelled/revoked.

        Returns the GPU-seconds the lease held in all (0 for a request never granted).
        A caller that knows them (a lease never shrunk: GPUs x held time) passes
        `gpu_s`, which skips summing the lease's `lease_gpus` rows.
        """
        with self.transaction():
            self.conn.execute(
                "UPDATE leases SET state = ?, released_at = ?, reason = ? WHERE lease_id = ?",
                (str(state), at, reason, lease_id),
            )
            self.conn.execute(
                "UPDATE lease_gpus SET end_at = MAX(?, start_at) WHERE lease_id = ? AND "
                "end_at IS NULL",
                (at, lease_id),
            )
            if gpu_s is not None:
                return gpu_s
            row = self.conn.execute(
                "SELECT SUM(end_at - start_at) FROM lease_gpus WHERE lease_id = ?", (lease_id,)
            ).fetchone()
        return float(row[0] or 0.0)

    def head_gpu_seconds(self, lease_id: int) -> float | None:
        """GPU-seconds an ended lease held before it first gave GPUs back (a rollout
        before its tail), or None where it never did (it held all it had to its end)."""
        row = self.conn.execute(
            "SELECT MIN(g.end_at), MAX(g.end_at) FROM lease_gpus g WHERE g.lease_id = ?",
            (lease_id,)).fetchone()
        first, last = row
        if first is None or first >= last:
            return None
        row = self.conn.execute(
            "SELECT SUM(MIN(end_at, ?) - start_at) FROM lease_gpus WHERE lease_id = ? AND "
            "start_at < ?", (first, lease_id, first)).fetchone()
        return float(row[0] or 0.0)

    def held_gpu_seconds(self, lease_ids: Sequence[int], now: float) -> dict[int, float]:
        """GPU-seconds each of the (held) `lease_ids` has held up to `now`: its holds of
        each GPU, as `lease_ended` will sum them."""
        if not lease_ids:
            return {}
        rows = self._q(
            "SELECT lease_id, SUM(COALESCE(end_at, MAX(?, start_at)) - start_at) AS s"
            f" FROM lease_gpus WHERE lease_id IN ({','.join('?' * len(lease_ids))})"
            " GROUP BY lease_id", (now, *lease_ids))
        return {int(r["lease_id"]): float(r["s"] or 0.0) for r in rows}

    def renew(self, lease_ids: Sequence[int], deadline_at: float) -> None:
        if not lease_ids:
            return
        self._x(
            f"UPDATE leases SET deadline_at = ? WHERE lease_id IN "
            f"({','.join('?' * len(lease_ids))})",
            (deadline_at, *lease_ids),
        )

    def lease(self, lease_id: int) -> LeaseRecord | None:
        rows = self._q("SELECT * FROM leases WHERE lease_id = ?", (lease_id,))
        return _lease(rows[0]) if rows else None

    def leases(
        self, *, open_only: bool = False, job_id: int | None = None,
        pool_id: int | None = None,
    ) -> list[LeaseRecord]:
        where: list[str] = []
        params: list[Any] = []
        if open_only:
            where.append("state IN ('waiting', 'held')")
        if job_id is not None:
            where.append("job_id = ?")
            params.append(job_id)
        if pool_id is not None:
            where.append("pool_id = ?")
            params.append(pool_id)
        sql = "SELECT * FROM leases" + (" WHERE " + " AND ".join(where) if where else "")
        return [_lease(r) for r in self._q(sql + " ORDER BY lease_id", params)]

    def open_state(self, pool_id: int) -> tuple[list[Lease], list[PhaseRequest]]:
        """Held leases and waiting requests of a pool, as the lease table restores them."""
        held: list[Lease] = []
        waiting: list[PhaseRequest] = []
        for r in self.leases(open_only=True, pool_id=pool_id):
            if r.state is LeaseState.HELD:
                assert r.granted_at is not None
                held.append(Lease(r.lease_id, r.job_id, r.phase, frozenset(r.gpus),
                                  r.requested_at, r.granted_at, r.deadline_at))
            else:
                waiting.append(PhaseRequest(r.lease_id, r.job_id, r.phase,
                                            frozenset(r.wanted), r.min_gpus,
                                            r.requested_at, r.deadline_at))
        return held, waiting

    def intervals(self, pool_id: int | None = None) -> list[Interval]:
        """Every GPU hold ever recorded, for `check_history`."""
        sql, params = "SELECT * FROM lease_gpus", list[Any]()
        if pool_id is not None:
            sql, params = sql + " WHERE pool_id = ?", [pool_id]
        return [Interval(r["lease_id"], r["pool_id"], r["gpu"], r["start_at"], r["end_at"])
                for r in self._q(sql, params)]

    # -- observations and ledger -------------------------------------------------------------
    def add_observation(
        self, *, job_id: int, phase: Phase, lease_id: int | None = None,
        requested_at: float | None = None, granted_at: float | None = None,
        released_at: float | None = None, busy_s: float | None = None, gpus: int = 0,
        detail: dict[str, Any] | None = None,
    ) -> int:
        return self._x(
            "INSERT INTO observations (job_id, phase, lease_id, requested_at, granted_at,"
            " released_at, busy_s, gpus, detail) VALUES (?,?,?,?,?,?,?,?,?)",
            (job_id, str(phase), lease_id, requested_at, granted_at, released_at, busy_s,
             gpus, json.dumps(detail or {}, sort_keys=True)),
        )

    def gap_observation(self, *, job_id: int, phase: Phase, started_at: float,
                        ended_at: float, busy_s: float | None,
                        detail: dict[str, Any] | None) -> int | None:
        """The id of the job's off-GPU observation with exactly these fields (one a
        driver reported already: its resend after a lost answer), if any."""
        rows = self._q(
            "SELECT observation_id FROM observations WHERE job_id = ? AND phase = ? AND"
            " lease_id IS NULL AND requested_at = ? AND released_at = ? AND busy_s IS ?"
            " AND detail = ? ORDER BY observation_id LIMIT 1",
            (job_id, str(phase), started_at, ended_at, busy_s,
             json.dumps(detail or {}, sort_keys=True)))
        return int(rows[0]["observation_id"]) if rows else None

    def observations(self, job_id: int | None = None,
                     after: int = 0) -> list[ObservationRecord]:
        """Observations in the order recorded (of `job_id`; `after`: those recorded after
        that observation id only)."""
        sql, params = "SELECT * FROM observations WHERE observation_id > ?", [after]
        if job_id is not None:
            sql, params = sql + " AND job_id = ?", [after, job_id]
        out = []
        for r in self._q(sql + " ORDER BY observation_id", params):
            r["phase"] = Phase(r["phase"])
            r["detail"] = json.loads(r["detail"])
            out.append(ObservationRecord(**r))
        return out

    def add_ledger(self, *, job_id: int, lease_id: int | None, pool_id: int | None,
                   gpu_seconds: float, at: float) -> None:
        self._x("INSERT INTO ledger (job_id, lease_id, pool_id, gpu_seconds, at)"
                " VALUES (?,?,?,?,?)", (job_id, lease_id, pool_id, gpu_seconds, at))

    def lease_waits(self, job_ids: Sequence[int], now: float) -> dict[int, tuple[float, float]]:
        """Per job with a phase request: (when it made its first, seconds its requests
        waited for GPUs up to `now`: a granted one until its grant, one never granted
        until it was cancelled or revoked, or until `now` while it waits)."""
        if not job_ids:
            return {}
        rows = self._q(
            "SELECT job_id, MIN(requested_at) AS first,"
            " SUM(MAX(0.0, COALESCE(granted_at, released_at, ?) - requested_at)) AS w"
            f" FROM leases WHERE job_id IN ({','.join('?' * len(job_ids))})"
            " GROUP BY job_id", (now, *job_ids))
        return {int(r["job_id"]): (float(r["first"]), float(r["w"] or 0.0)) for r in rows}

    def gpu_seconds(self, job_ids: Sequence[int] | None = None) -> dict[int, float]:
        """GPU-seconds granted per job (ended leases only)."""
        sql, params = "SELECT job_id, SUM(gpu_seconds) AS s FROM ledger", list[Any]()
        if job_ids is not None:
            sql += f" WHERE job_id IN ({','.join('?' * len(job_ids))})"
            params = list(job_ids)
        return {int(r["job_id"]): float(r["s"] or 0.0)
                for r in self._q(sql + " GROUP BY job_id", params)}


def _statements(script: str) -> list[str]:
    """Split a migration into statements (executescript would commit on its own)."""
    out, buf = [], ""
    for part in script.split(";"):
        buf += part + ";"
        if sqlite3.complete_statement(buf):
            if buf.strip(" \n;"):
                out.append(buf)
            buf = ""
    return out


def _job(r: dict[str, Any]) -> JobRecord:
    return JobRecord(
        job_id=r["job_id"], user=r["user"], uid=r["uid"],
        request=request_from_json(r["request"]), state=JobState(r["state"]),
        registered_at=r["registered_at"], name=r["name"], partition=r["partition"],
        reason=r["reason"], pool_id=r["pool_id"], group_id=r["group_id"],
        pool_gpus=ints(r["pool_gpus"]), phase=r["phase"], secret=r["secret"],
        ended_at=r["ended_at"], slurm_started_at=r.get("slurm_started_at"),  # schema 9
    )


def _pool(r: dict[str, Any]) -> PoolRecord:
    return PoolRecord(
        pool_id=r["pool_id"], gpus=r["gpus"], state=r["state"], opened_at=r["opened_at"],
        slurm_job_id=r["slurm_job_id"], partition=r["partition"],
        nodes=tuple(json.loads(r["nodes"])), gpu_indices=ints(r["gpu_indices"]),
        dedicated=bool(r["dedicated"]), reason=r["reason"], closed_at=r["closed_at"],
        floating=bool(r.get("floating", 0)),  # absent from a DB older than schema 5
    )


def _lease(r: dict[str, Any]) -> LeaseRecord:
    return LeaseRecord(
        lease_id=r["lease_id"], pool_id=r["pool_id"], job_id=r["job_id"],
        phase=Phase(r["phase"]), wanted=ints(r["wanted"]), gpus=ints(r["gpus"]),
        min_gpus=r["min_gpus"], state=LeaseState(r["state"]),
        requested_at=r["requested_at"], deadline_at=r["deadline_at"],
        granted_at=r["granted_at"], released_at=r["released_at"], reason=r["reason"],
    )
