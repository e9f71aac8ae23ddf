"""`slurmrl report`: the arithmetic on hand-built histories, and the CLI on a real Store."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmrl.cli.report import report
from slurmrl.db import JobRecord, Store
from slurmrl.db.migrations import MIGRATIONS
from slurmrl.leases.types import Lease
from slurmrl.model import JobState, LeaseState, Phase, RlRequest
from slurmrl.report.compute import (
    Hold,
    JobInfo,
    PoolInfo,
    ReportInput,
    Request,
    RewardPoint,
    compute,
    quantile,
)
from slurmrl.report.sources import SourceError, load_baseline


def _pair() -> ReportInput:
    """Two 2-GPU jobs alternating on one 2-GPU pool for 100 s, 10 s turns."""
    jobs = (JobInfo(1, "alice", 2, 0.0, "a", "CD", 100.0, 7),
            JobInfo(2, "bob", 2, 0.0, "b", "CD", 100.0, 7))
    holds, requests = [], []
    for k in range(10):
        job = 1 + k % 2
        for g in (0, 1):
            holds.append(Hold(k, job, 7, g, "rollout", 10.0 * k, 10.0 * k + 10))
        requests.append(Request(k, job, 7, "rollout", 10.0 * k - (2.0 if job == 2 else 0.0),
                                10.0 * k, 10.0 * k + 10))
    rewards = tuple(RewardPoint(1, s, 10.0 * s, 0.1 * s) for s in range(10))
    return ReportInput(jobs, (PoolInfo(7, 2, 0.0, 100.0),), tuple(holds), tuple(requests),
                       rewards, now=500.0)


def test_a_pair_saves_half_of_dedicated_and_uses_the_whole_pool() -> None:
    rep = compute(_pair())
    a, b = rep.jobs
    assert a.dedicated_gpu_s == 200.0 and a.granted_gpu_s == 100.0 and a.saved == 0.5
    # b's dedicated clock starts at its first request (8 s), not at its registration (0)
    assert b.dedicated_gpu_s == 2 * (100.0 - 8.0)
    assert rep.totals.granted_gpu_s == 200.0 and rep.totals.dedicated_gpu_s == 384.0
    assert rep.totals.saved == pytest.approx(1 - 200.0 / 384.0)
    (pool,) = rep.pools
    assert pool.utilisation == 1.0 and pool.members == (1, 2)
    # every turn change moves both GPUs to the other job: 9 changes x 2 GPUs
    assert pool.handoffs == 18 and len(rep.handoffs) == 18
    assert b.wait.count == 5 and b.wait.total_s == 10.0 and b.wait.p95_s == 2.0
    assert a.wait.total_s == 0.0


def test_slowdown_is_na_without_a_baseline_and_never_invented() -> None:
    rep = compute(_pair())
    assert [j.slowdown for j in rep.jobs] == [None, None]
    rep = compute(_pair(), {"a": 80.0})
    assert rep.jobs[0].slowdown == pytest.approx(100.0 / 80.0)
    assert rep.jobs[1].slowdown is None
    assert any("no job named 'b'" in w for w in rep.warnings)


def test_an_ambiguous_baseline_name_gives_na_with_a_warning() -> None:
    rep = compute(_pair(), {"b": 50.0}, ambiguous={"a"})
    assert rep.jobs[0].slowdown is None and rep.jobs[1].slowdown == 2.0
    assert any("more than once" in w for w in rep.warnings)


def test_a_running_job_and_an_open_hold_count_up_to_now() -> None:
    data = ReportInput((JobInfo(5, "u", 4, 100.0),), (PoolInfo(1, 4, 100.0),),
                       (Hold(1, 5, 1, 0, "train", 150.0, None),),
                       (Request(1, 5, 1, "train", 140.0, 150.0, None, "held"),
                        Request(2, 5, 1, "rollout", 140.0, None, 141.0, "cancelled")),
                       now=200.0)
    (j,) = compute(data).jobs
    # dedicated from its first request (140) to now: 4 GPUs x 60 s; wall from registration
    assert j.wall_s == 100.0 and j.dedicated_gpu_s == 240.0 and j.granted_gpu_s == 50.0
    assert j.wait.count == 1 and j.wait.never_granted == 1


def test_a_mux_off_job_saved_nothing_however_idle_its_pool_was() -> None:
    # a dedicated job leased 50 of its pool's 400 GPU-seconds: the rest was idle, but
    # nobody else could have used it, so the report must not call that a saving
    data = ReportInput((JobInfo(5, "u", 4, 100.0, "solo", "CD", 200.0, 1, dedicated=True),),
                       (PoolInfo(1, 4, 100.0, 200.0, dedicated=True),),
                       (Hold(1, 5, 1, 0, "train", 150.0, 200.0),), (), now=300.0)
    (j,) = compute(data).jobs
    # no request recorded: its dedicated clock starts at its first hold's (150 s)
    assert j.granted_gpu_s == 50.0 and j.dedicated_gpu_s == 200.0
    assert j.saved == 0.0


def test_reward_curve_summary_first_and_last_steps() -> None:
    a = compute(_pair()).jobs[0]
    assert len(a.rewards) == 10
    assert a.reward_first == pytest.approx(0.2) and a.reward_last == pytest.approx(0.7)
    assert compute(_pair()).jobs[1].reward_first is None


def test_quantile_interpolates() -> None:
    assert quantile([], 0.5) is None
    assert quantile([3.0], 0.95) == 3.0
    assert quantile([0.0, 10.0], 0.5) == 5.0


# -- the CLI on a real Store --------------------------------------------------------------

def _db(path: Path, name_b: str = "b") -> Path:
    """A DB with two jobs sharing pool 1 through real Store writes, one reward each step."""
    store = Store(path)
    pool = store.add_pool(gpus=2, opened_at=1000.0, slurm_job_id=9)
    for jid, name in ((11, "a"), (12, name_b)):
        store.add_job(JobRecord(jid, f"user{jid}", 2000 + jid, RlRequest(gpus=2),
                                JobState.RUNNING, 1000.0, name=name, pool_id=pool,
                                pool_gpus=(0, 1)))
    t = 1000.0
    for k in range(6):
        jid = 11 + k % 2
        lid = store.add_request(pool_id=pool, job_id=jid, phase=Phase.ROLLOUT,
                                wanted=(0, 1), min_gpus=2, requested_at=t - 1,
                                deadline_at=t + 100)
        store.lease_granted(pool, Lease(lid, jid, Phase.ROLLOUT, frozenset({0, 1}), t - 1, t,
                                        t + 100))
        if k == 2:  # a shrink: GPU 1 handed back after 5 s
            store.lease_shrunk(Lease(lid, jid, Phase.ROLLOUT, frozenset({0}), t - 1, t,
                                     t + 100), [1], t + 5)
        gpu_s = store.lease_ended(lid, LeaseState.RELEASED, t + 10)
        store.add_ledger(job_id=jid, lease_id=lid, pool_id=pool, gpu_seconds=gpu_s, at=t + 10)
        store.add_observation(job_id=jid, phase=Phase.REWARD, requested_at=t + 10,
                              released_at=t + 11, detail={"step": k // 2,
                                                          "reward": 0.2 * k})
        t += 10
    for jid in (11, 12):
        store.update_job(jid, state="CD", ended_at=1060.0)
    store.update_pool(pool, state="closed", closed_at=1060.0)
    store.close()
    return path


def test_cli_prints_jobs_pools_and_ledger(tmp_path: Path) -> None:
    db = _db(tmp_path / "c.db")
    res = CliRunner().invoke(report, ["--db", str(db)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].split()[:3] == ["JOBID", "USER", "NAME"]
    row11 = next(x for x in lines if x.split()[:1] == ["11"])
    # 3 leases x 2 GPUs x 10 s, one shrunk by 5 s on one GPU = 55 of 120 dedicated
    assert "55.0" in row11 and "120.0" in row11 and "54.2%" in row11 and "n/a" in row11
    assert "0.00 -> 0.80 (3 steps)" in row11
    assert "saved" in lines[-1] and "115.0 GPU-s" in lines[-1]


def test_cli_json_envelope_and_baseline(tmp_path: Path) -> None:
    db = _db(tmp_path / "c.db")
    base = tmp_path / "solo.json"
    base.write_text(json.dumps({"a": 30.0, "b": 40.0}))
    res = CliRunner().invoke(report, ["--db", str(db), "--json", "--baseline", str(base)])
    assert res.exit_code == 0, res.output
    env = json.loads(res.output)
    assert set(env) >= {"meta", "errors", "warnings", "jobs", "pools", "totals", "handoffs"}
    assert env["meta"]["command"] == "slurmrl report" and env["errors"] == []
    slow = {j["job_id"]: j["slowdown"] for j in env["jobs"]}
    assert slow == {11: pytest.approx(2.0), 12: pytest.approx(1.5)}
    assert env["pools"][0]["utilisation"] == pytest.approx(115.0 / 120.0)
    # the report's own JSON is accepted as a baseline
    out = tmp_path / "run.json"
    out.write_text(res.output)
    assert load_baseline(str(out), 0.0) == ({"a": 60.0, "b": 60.0}, set())


def test_cli_baseline_from_a_dedicated_runs_db(tmp_path: Path) -> None:
    db = _db(tmp_path / "c.db")
    solo = _db(tmp_path / "solo.db")
    res = CliRunner().invoke(report, ["--db", str(db), "--json", "--baseline", str(solo)])
    assert [j["slowdown"] for j in json.loads(res.output)["jobs"]] == [1.0, 1.0]


def test_cli_plot_writes_a_png(tmp_path: Path) -> None:
    db = _db(tmp_path / "c.db")
    png = tmp_path / "t.png"
    res = CliRunner().invoke(report, ["--db", str(db), "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "timeline written" in res.output


def test_cli_errors_name_what_is_wrong(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(report, ["--db", str(tmp_path / "nope.db")])
    assert res.exit_code == 1 and "no colocation DB at" in res.output
    assert not (tmp_path / "nope.db").exists()  # a typo must not create a DB
    res = runner.invoke(report, ["--db", "x", "--controller", "http://h:1"])
    assert res.exit_code == 2 and "exclusive" in res.output
    res = runner.invoke(report, ["--db", "x", "-j", "1,x"])
    assert res.exit_code == 2 and "'x'" in res.output
    res = runner.invoke(report, ["--db", "x", "--plot", "t.svg"])
    assert res.exit_code == 2 and "PNG" in res.output
    db = _db(tmp_path / "c.db")
    # "²".isdigit() is True but int() refuses it; past 2^63 SQLite raises OverflowError
    for ids in ("\u00b2", "12,99999999999999999999999", "0"):
        res = runner.invoke(report, ["--db", str(db), "-j", ids])
        assert res.exit_code == 2, (ids, res.output)
        assert "-j takes comma-separated job ids" in res.output, ids
    bad = tmp_path / "bad.json"
    bad.write_text('["a"]')
    res = runner.invoke(report, ["--db", str(db), "--baseline", str(bad)])
    assert res.exit_code == 1 and "expected a `slurmrl report --json`" in res.output
    with pytest.raises(SourceError, match="no such file"):
        load_baseline(str(tmp_path / "missing.json"), 0.0)


def test_cli_job_filter_and_unknown_id_warning(tmp_path: Path) -> None:
    db = _db(tmp_path / "c.db")
    res = CliRunner().invoke(report, ["--db", str(db), "--json", "-j", "12,99"])
    env = json.loads(res.output)
    assert [j["job_id"] for j in env["jobs"]] == [12]
    assert any("no RL job 99" in w for w in env["warnings"])


# -- a report reads its DB files, it never writes to them -----------------------------------

def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _other_programs_db(path: Path) -> Path:
    conn = sqlite3.connect(path)  # a rollback-journal DB, as most programs keep theirs
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
    conn.execute("INSERT INTO notes (text) VALUES ('mine')")
    conn.commit()
    conn.close()
    return path


@pytest.mark.parametrize(("flag", "kind"), [("--db", "empty"), ("--db", "other"),
                                           ("--baseline", "other")])
def test_cli_refuses_a_file_that_is_no_slurmrl_db_and_leaves_it_unchanged(
        tmp_path: Path, flag: str, kind: str) -> None:
    bad = tmp_path / "x.db"
    if kind == "empty":
        bad.touch()
    else:
        _other_programs_db(bad)
    before = _sha(bad)
    args = ["--db", str(bad)] if flag == "--db" else ["--db", str(_db(tmp_path / "c.db")),
                                                       "--baseline", str(bad)]
    res = CliRunner().invoke(report, args)
    assert res.exit_code == 1, res.output
    prefix = "baseline: " if flag == "--baseline" else ""
    assert (f"slurmrl report: {prefix}{bad} is not a slurmrl colocation DB (it has no "
            "slurmrl schema)") in res.output
    assert _sha(bad) == before
    if kind == "other":  # still its own: no slurmrl table, not switched to WAL
        conn = sqlite3.connect(f"file:{bad}?mode=ro", uri=True)
        assert {r[0] for r in conn.execute("SELECT name FROM sqlite_master")} == {"notes"}
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        conn.close()


def test_cli_reports_an_older_slurmrl_db_without_upgrading_it(tmp_path: Path) -> None:
    db = tmp_path / "run ?#%1.db"  # characters a SQLite URI must escape
    conn = sqlite3.connect(db)  # the history of `_db` in the version-1 schema
    conn.executescript(MIGRATIONS[0] + "PRAGMA user_version = 1;")
    conn.execute("ATTACH DATABASE ? AS src", (str(_db(tmp_path / "c.db")),))
    for table in ("pools", "jobs", "leases", "lease_gpus", "observations", "ledger"):
        cols = ", ".join(r[1] for r in conn.execute(f"PRAGMA main.table_info({table})"))
        conn.execute(f"INSERT INTO main.{table} SELECT {cols} FROM src.{table}")
    conn.commit()
    conn.close()
    before = _sha(db)
    res = CliRunner().invoke(report, ["--db", str(db), "--json", "--baseline", str(db)])
    assert res.exit_code == 0, res.output
    env = json.loads(res.output)
    assert [(j["job_id"], j["granted_gpu_s"], j["slowdown"]) for j in env["jobs"]] == [
        (11, 55.0, 1.0), (12, 60.0, 1.0)]
    assert _sha(db) == before  # not upgraded to the latest schema, not switched to WAL


def test_cli_a_malformed_controller_url_is_a_clear_error() -> None:
    res = CliRunner().invoke(report, ["--controller", "garbage"])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.exception
    assert ("slurmrl report: controller URL 'garbage' must look like http://host:port"
            in res.output)


@pytest.mark.parametrize(("walls", "says"), [
    ('{"a": -100}', "job 'a''s wall time must be a finite number of seconds > 0, got -100.0"),
    ('{"a": 60, "b": NaN}', "job 'b''s wall time must be"),
    ('{"jobs": [{"name": "a", "wall_s": 0}]}', "job 'a''s wall time must be"),
])
def test_a_baseline_wall_time_that_is_not_a_positive_number_is_refused_by_name(
        tmp_path: Path, walls: str, says: str) -> None:
    # a negative or NaN wall time gave slowdowns of -17956937.45 and nan (and --json a
    # bare NaN, which is not JSON)
    path = tmp_path / "base.json"
    path.write_text(walls)
    with pytest.raises(SourceError, match=re.escape(f"baseline {path}: {says}")):
        load_baseline(str(path), 0.0)


def test_a_job_never_placed_saved_nothing_and_the_totals_agree_with_the_rows() -> None:
    # one --rl-mux=off job (2 GPUs x 100 s, 50 GPU-s leased) and one cancelled before
    # any pool: neither saved anything, and the ledger must not say they did
    data = ReportInput((JobInfo(1, "u", 2, 0.0, "solo", "CD", 100.0, 1, dedicated=True),
                        JobInfo(2, "u", 2, 0.0, "gone", "CA", 100.0, None)),
                       (PoolInfo(1, 2, 0.0, 100.0, dedicated=True),),
                       (Hold(1, 1, 1, 0, "train", 0.0, 50.0),), (), now=300.0)
    rep = compute(data)
    solo, gone = rep.jobs
    assert (solo.saved, gone.saved) == (0.0, None)
    assert rep.totals.jobs == 1 and rep.totals.saved == 0.0


def test_cli_reads_a_schema_5_db_with_a_floating_pool(tmp_path: Path) -> None:
    # pool windows gained their `node` in schema 6; an older DB is read as it is
    db = tmp_path / "v5.db"
    conn = sqlite3.connect(db)
    conn.executescript("".join(MIGRATIONS[:5]) + "PRAGMA user_version = 5;")
    conn.execute("INSERT INTO pools (pool_id, gpus, state, opened_at, closed_at, floating) "
                 "VALUES (1, 4, 'closed', 0, 100, 1)")
    for window, sjob, gpus, opened in ((0, 900, "[0,1]", 0), (1, 901, "[2,3]", 50)):
        conn.execute("INSERT INTO pool_windows (pool_id, window, slurm_job_id, gpu_indices, "
                     "opened_at, closed_at) VALUES (1, ?, ?, ?, ?, 100)",
                     (window, sjob, gpus, opened))
    conn.execute("INSERT INTO jobs (job_id, user, uid, name, request, state, registered_at, "
                 "ended_at, pool_id, pool_gpus) VALUES (11, 'u', 1, 'a', ?, 'CD', 0, 100, 1, "
                 "'[0,1]')", (json.dumps({"gpus": 2}),))
    conn.commit()
    conn.close()
    res = CliRunner().invoke(report, ["--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    (pool,) = json.loads(res.output)["pools"]
    assert pool["open_s"] == 100.0


def test_cli_a_db_damaged_past_its_header_is_a_clear_error(tmp_path: Path) -> None:
    db = _db(tmp_path / "c.db")
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'leases'").fetchone()[0]
    size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    raw = bytearray(db.read_bytes())
    raw[(page - 1) * size:page * size] = b"\xa5" * size
    db.write_bytes(bytes(raw))
    res = CliRunner().invoke(report, ["--db", str(db), "--json"])
    assert res.exit_code == 1 and not isinstance(res.exception, sqlite3.Error)
    assert f"slurmrl report: cannot read {db}:" in res.output
    assert json.loads(res.output[:res.output.rindex("}") + 1])["errors"]


def test_wait_quantiles_and_requests_never_granted_are_told_apart() -> None:
    base = _pair()
    # job 2 waited 1, 2, ..., 20 s for twenty grants; one request was withdrawn, and one
    # still waits (not yet "never granted")
    reqs = [Request(100 + k, 2, 7, "rollout", 1000.0 * k, 1000.0 * k + (k + 1), 1000.0 * k + 50)
            for k in range(20)]
    reqs += [Request(200, 2, 7, "train", 30000.0, None, 30010.0, "cancelled"),
             Request(201, 2, 7, "train", 40000.0, None, None, "waiting")]
    rep = compute(replace(base, requests=tuple(reqs)))
    b = next(j for j in rep.jobs if j.job_id == 2)
    assert b.wait.count == 20 and b.wait.total_s == sum(range(1, 21))
    assert b.wait.p50_s == pytest.approx(quantile([float(k) for k in range(1, 21)], 0.5))
    assert b.wait.p95_s == pytest.approx(quantile([float(k) for k in range(1, 21)], 0.95))
    assert b.wait.p95_s > b.wait.p50_s + 5
    assert b.wait.never_granted == 1  # the withdrawn one; the waiting one is not yet
