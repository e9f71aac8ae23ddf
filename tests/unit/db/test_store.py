"""The colocation DB: schema versioning, transactions, and restart from the file alone."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from slurmrl.db import JobRecord, Store, StoreError
from slurmrl.db.migrations import LATEST, MIGRATIONS
from slurmrl.db.records import request_from_json, request_to_json
from slurmrl.leases.invariants import InvariantViolation, check_history
from slurmrl.leases.types import Lease
from slurmrl.model import JobState, Layout, LeaseState, Mux, Phase, PhasePrior, RlRequest


def _job(job_id: int, **kw: object) -> JobRecord:
    req = RlRequest(gpus=4, model="/m/q7b", mux=Mux.ON, layout=Layout.DISAGGREGATED,
                    rollout_gpus=3, max_slowdown=1.2, steps=1200,
                    profile=PhasePrior(((Phase.ROLLOUT, 0.6), (Phase.TRAIN, 0.4)), 30.0))
    return JobRecord(job_id=job_id, user="alice", uid=1002, request=req,
                     state=JobState.PENDING, registered_at=1.0, **kw)  # type: ignore[arg-type]


def test_new_db_is_at_the_latest_version_in_wal_mode(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.db")
    assert store.version == LATEST
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert {"jobs", "pools", "groups", "services", "leases", "lease_gpus", "observations",
            "ledger"} <= set(store.db.table_names())


@pytest.mark.parametrize("existing_mode", [None, 0o644])
def test_the_db_and_its_side_files_are_readable_by_their_owner_only(
        tmp_path: Path, existing_mode: int | None) -> None:
    # it holds every job's secret, which signs calls to that job's services
    path = tmp_path / "c.db"
    if existing_mode is not None:  # a DB an earlier version left world-readable
        Store(path).close()
        for f in tmp_path.iterdir():
            f.chmod(existing_mode)
    store = Store(path)
    store.add_job(_job(1))  # writes: the WAL and its index exist now
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["c.db", "c.db-shm", "c.db-wal"]
    assert {f.name: oct(f.stat().st_mode & 0o777) for f in files} == {
        f.name: "0o600" for f in files}
    store.close()


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    Store(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {LATEST + 1}")
    conn.close()
    with pytest.raises(StoreError, match="newer than this slurmrl"):
        Store(path)


def test_a_version_2_db_upgrades_keeping_its_holds_and_a_lease_may_retake_a_gpu(
        tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    conn = sqlite3.connect(path)
    conn.executescript(MIGRATIONS[0] + MIGRATIONS[1] + "PRAGMA user_version = 2;")
    conn.execute("INSERT INTO leases (lease_id, pool_id, job_id, phase, wanted, min_gpus,"
                 " state, requested_at, deadline_at) VALUES (5, 1, 1, 'rollout', '[0]', 1,"
                 " 'held', 1.0, 9.0)")
    conn.execute("INSERT INTO lease_gpus VALUES (5, 1, 0, 1.0, 2.0)")
    conn.commit()
    conn.close()
    store = Store(path)
    assert store.version == LATEST
    assert [(iv.lease_id, iv.gpu, iv.start, iv.end) for iv in store.intervals(1)] == [
        (5, 0, 1.0, 2.0)]
    # lease 5 shrank off GPU 0 at 2.0 and grows back onto it at 3.0: a second hold
    store.lease_grown(1, Lease(5, 1, Phase.ROLLOUT, frozenset({0}), 1.0, 1.0, 9.0), [0], 3.0)
    assert store.lease_ended(5, LeaseState.RELEASED, 4.0) == pytest.approx(1.0 + 1.0)
    check_history(store.intervals(1))


def test_job_round_trips_with_its_request(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.db")
    store.add_job(_job(7, name="grpo"))
    store.update_job(7, state=JobState.RUNNING, pool_gpus=(2, 3, 0, 1), pool_id=None)
    got = store.job(7)
    assert got is not None and got.request == _job(7).request
    assert got.state is JobState.RUNNING and got.pool_gpus == (2, 3, 0, 1)
    assert got.pool_gpus_for(Phase.TRAIN) == frozenset({1})
    with pytest.raises(StoreError, match="cannot update job columns"):
        store.update_job(7, uid=0)


def test_a_request_recorded_before_rl_steps_loads_without_steps() -> None:
    req = _job(7).request
    assert request_from_json(request_to_json(req)) == req
    old = json.loads(request_to_json(req))
    del old["steps"]
    assert request_from_json(json.dumps(old)) == replace(req, steps=None)


def test_a_failed_transaction_changes_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.db")
    with pytest.raises(RuntimeError), store.transaction():
        store.add_job(_job(1))
        raise RuntimeError("boom")
    assert store.job(1) is None
    assert store.count_jobs() == 0


def test_leases_survive_a_reopen_and_history_is_checkable(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    store = Store(path)
    store.add_job(_job(1))
    pool = store.add_pool(gpus=2, opened_at=0.0)
    rid = store.add_request(pool_id=pool, job_id=1, phase=Phase.ROLLOUT, wanted=[0, 1],
                            min_gpus=2, requested_at=10.0, deadline_at=20.0)
    store.lease_granted(pool, Lease(rid, 1, Phase.ROLLOUT, frozenset({0, 1}), 10.0, 11.0, 21.0))
    store.lease_shrunk(Lease(rid, 1, Phase.ROLLOUT, frozenset({0}), 10.0, 11.0, 21.0), [1], 12.0)
    waiting = store.add_request(pool_id=pool, job_id=1, phase=Phase.TRAIN, wanted=[1],
                                min_gpus=1, requested_at=13.0, deadline_at=23.0)
    store.close()

    again = Store(path)
    held, queued = again.open_state(pool)
    assert [x.lease_id for x in held] == [rid] and held[0].gpus == frozenset({0})
    assert [x.request_id for x in queued] == [waiting]
    assert again.lease_ended(rid, LeaseState.RELEASED, 15.0) == pytest.approx(4.0 + 1.0)
    check_history(again.intervals(pool))
    assert again.lease(rid).state is LeaseState.RELEASED  # type: ignore[union-attr]


def test_overlapping_holds_in_the_db_are_caught(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.db")
    store.add_job(_job(1))
    pool = store.add_pool(gpus=1, opened_at=0.0)
    for t in (1.0, 2.0):
        rid = store.add_request(pool_id=pool, job_id=1, phase=Phase.TRAIN, wanted=[0],
                                min_gpus=1, requested_at=t, deadline_at=t + 9)
        store.lease_granted(pool, Lease(rid, 1, Phase.TRAIN, frozenset({0}), t, t, t + 9))
    with pytest.raises(InvariantViolation, match="overlap"):
        check_history(store.intervals(pool))


def test_ten_thousand_jobs(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.db")
    with store.transaction():
        for i in range(1, 10_001):
            store.add_job(_job(i))
    assert store.count_jobs() == 10_000
    assert [j.job_id for j in store.jobs(ids=[5, 9999])] == [5, 9999]
    assert store.jobs(active=False) == []


def test_a_version_3_db_upgrades_and_keeps_each_services_control_secret(
        tmp_path: Path) -> None:
    # migration 4: the controller's own key to a service (park, activate, stop); a row
    # from before it has none, and the job's secret opens that service as before
    path = tmp_path / "c.db"
    conn = sqlite3.connect(path)
    conn.executescript("".join(MIGRATIONS[:3]) + "PRAGMA user_version = 3;")
    conn.commit()
    conn.close()
    store = Store(path)
    store.add_job(_job(7))
    store.close()
    conn = sqlite3.connect(path)  # a row without the column, as version 3 wrote them
    conn.execute("INSERT INTO services (job_id, role, started_at) VALUES (7, 'rollout', 1.0)")
    conn.commit()
    conn.close()
    store = Store(path)
    assert store.version == LATEST
    (old,) = store.services(job_id=7)
    assert old.control_secret is None
    sid = store.add_service(job_id=7, role="trainer", started_at=2.0)
    store.update_service(sid, address="n1:5000", control_secret="c" * 64)
    store.close()
    (_, new) = Store(path).services(job_id=7)  # from the file alone
    assert new.control_secret == "c" * 64 and "c" * 64 not in repr(new)


def test_a_floating_pool_is_charged_each_window_for_the_time_it_was_held(
        tmp_path: Path) -> None:
    s = Store(tmp_path / "c.db")
    fixed = s.add_pool(gpus=2, opened_at=0.0, slurm_job_id=100, gpu_indices=(0, 1))
    pid = s.add_pool(gpus=2, opened_at=0.0, slurm_job_id=101, gpu_indices=(2, 3),
                     floating=True)
    s.add_window(pool_id=pid, window=0, slurm_job_id=101, gpu_indices=(2, 3), opened_at=0.0)
    w1 = s.add_window(pool_id=pid, window=1, slurm_job_id=102, gpu_indices=(4, 5),
                      opened_at=10.0)
    s.update_pool(pid, gpus=4, gpu_indices=(2, 3, 4, 5))
    s.close_window(w1, 40.0)  # given back: the pool has 2 GPUs again
    s.update_pool(pid, gpus=2, gpu_indices=(2, 3))
    pool = s.pool(pid)
    assert pool is not None and pool.floating
    assert [w.window for w in s.windows(pid)] == [0]
    assert [w.window for w in s.windows(pid, open_only=False)] == [0, 1]
    # 2 GPUs for 100 s, and 2 more for the 30 s window 1 was held: not 2 x 100 s
    assert s.pool_gpu_seconds(pool, now=100.0) == 2 * 100 + 2 * 30
    f = s.pool(fixed)
    assert f is not None and s.pool_gpu_seconds(f, now=100.0) == 200.0


def test_a_version_5_db_upgrades_and_its_windows_are_on_the_pools_node(
        tmp_path: Path) -> None:
    # migration 6: a window's node (`slurm.floating_across_nodes`); one written before
    # it has none, read as the pool's own node
    path = tmp_path / "c.db"
    conn = sqlite3.connect(path)
    conn.executescript("".join(MIGRATIONS[:5]) + "PRAGMA user_version = 5;")
    conn.execute("INSERT INTO pools (gpus, opened_at, state, floating) VALUES (2, 0, 'open', 1)")
    conn.execute("INSERT INTO pool_windows (pool_id, window, slurm_job_id, gpu_indices,"
                 " opened_at) VALUES (1, 0, 101, '[0, 1]', 0)")
    conn.commit()
    conn.close()
    store = Store(path)
    assert store.version == LATEST
    (old,) = store.windows(1)
    assert old.node is None and old.slurm_job_id == 101
    store.add_window(pool_id=1, window=1, slurm_job_id=102, gpu_indices=(0, 1),
                     opened_at=5.0, node="n2")
    store.close()
    assert [(w.window, w.node) for w in Store(path).windows(1)] == [(0, None), (1, "n2")]


def test_the_controller_tag_is_made_once_and_kept(tmp_path: Path) -> None:
    # each allocation the controller opens carries it (PoolAllocator.tagged)
    store = Store(tmp_path / "c.db")
    tag = store.controller_tag()
    assert len(tag) == 16 and int(tag, 16) >= 0
    assert store.controller_tag() == tag
    store.close()
    assert Store(tmp_path / "c.db").controller_tag() == tag
    assert Store(tmp_path / "d.db").controller_tag() != tag


def test_commit_and_rollback_actions_run_once_the_outermost_transaction_ends(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "c.db")
    ran: list[str] = []
    with store.transaction():
        with store.transaction():
            store.after_commit(lambda: ran.append("told"))
            store.on_rollback(lambda: ran.append("undone"))
        assert ran == []  # the inner block's end commits nothing
    assert ran == ["told"]
    ran.clear()
    with pytest.raises(RuntimeError, match="boom"), store.transaction():
        store.after_commit(lambda: ran.append("told"))
        store.on_rollback(lambda: ran.append("first undone"))
        store.on_rollback(lambda: ran.append("last undone"))
        raise RuntimeError("boom")
    assert ran == ["last undone", "first undone"]
    ran.clear()
    store.after_commit(lambda: ran.append("at once"))  # outside a transaction
    assert ran == ["at once"]
    with pytest.raises(RuntimeError, match="outside a transaction"):
        store.on_rollback(lambda: None)


def test_memory_is_undone_though_sqlite_rolled_back_itself_and_every_commit_action_runs(
        tmp_path: Path) -> None:
    # disk full or an I/O error: SQLite ends the transaction itself, and the explicit
    # ROLLBACK then fails; the undo must still run and the caller see the real error
    store = Store(tmp_path / "c.db")
    ran: list[str] = []
    with pytest.raises(RuntimeError, match="disk full"), store.transaction():
        store.on_rollback(lambda: ran.append("undone"))
        store.conn.execute("ROLLBACK")  # as SQLite does on SQLITE_FULL
        raise RuntimeError("disk full")
    assert ran == ["undone"]
    ran.clear()

    def broken() -> None:
        raise OSError("hook failed")

    with store.transaction():
        store.after_commit(broken)
        store.after_commit(lambda: ran.append("the next waiter told"))
    assert ran == ["the next waiter told"]  # committed: one failing action stops none


def test_a_file_that_is_no_database_is_refused_naming_it(tmp_path: Path) -> None:
    # `slurmrl controller` prints this message: it used to be "file is not a database"
    bad = tmp_path / "slurmrl.db"
    bad.write_bytes(b"not sqlite at all" * 512)
    with pytest.raises(StoreError, match=f"cannot open the colocation DB {bad}: file is not a "
                                         "database"):
        Store(bad)
