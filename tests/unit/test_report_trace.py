"""`slurmrl report --trace`: a real Store's ended leases as a replayable trace."""

from __future__ import annotations

import json
import re
import resource
import signal
import tomllib
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurmrl.cli.report import report
from slurmrl.db import JobRecord, Store
from slurmrl.directives import STEP_MAX_S, parse_profile
from slurmrl.leases.types import Lease
from slurmrl.model import JobState, Layout, LeaseState, Mux, Phase, PhasePrior, RlRequest
from slurmrl.report.sources import SourceError
from slurmrl.report.trace import (
    TraceError,
    build_trace,
    profile_text,
    save_trace,
    write_trace,
)
from slurmrl.sim.cli import simulate
from slurmrl.sim.replay import replay, trace_jobs


def _grant(store: Store, pool: int, jid: int, phase: Phase, gpus: set[int],
           requested: float, granted: float) -> int:
    lid = store.add_request(pool_id=pool, job_id=jid, phase=phase, wanted=gpus,
                            min_gpus=len(gpus), requested_at=requested,
                            deadline_at=granted + 100)
    store.lease_granted(pool, Lease(lid, jid, phase, frozenset(gpus), requested, granted,
                                    granted + 100))
    return lid


def _db(path: Path) -> Path:
    """Pool 1: job 11 (colocated) and 12 (disaggregated, 1 rollout GPU) take turns, six
    ended leases from t=999 to t=1060 (the last one revoked), then 11 holds a lease not
    yet released and 12 cancels a request never granted. Pool 2: job 13 has only a lease
    still held. Job 11 also reports reward gaps (not leases)."""
    store = Store(path)
    p1 = store.add_pool(gpus=2, opened_at=990.0, slurm_job_id=9)
    p2 = store.add_pool(gpus=1, opened_at=990.0, slurm_job_id=10, dedicated=True)
    prior = PhasePrior(((Phase.ROLLOUT, 0.5), (Phase.TRAIN, 0.5)), 30.0)
    reqs = {11: RlRequest(gpus=2, model="Qwen2.5-0.5B", profile=prior, max_slowdown=1.3,
                          steps=400),
            12: RlRequest(gpus=2, layout=Layout.DISAGGREGATED, rollout_gpus=1),
            13: RlRequest(gpus=1, mux=Mux.OFF)}
    for jid, pool in ((11, p1), (12, p1), (13, p2)):
        store.add_job(JobRecord(jid, f"user{jid}", 2000 + jid, reqs[jid], JobState.RUNNING,
                                990.0, name=f"j{jid}", pool_id=pool,
                                pool_gpus=(0, 1) if pool == p1 else (0,)))
    t = 1000.0
    for k in range(6):
        jid = 11 + k % 2
        phase = Phase.ROLLOUT if k // 2 % 2 == 0 else Phase.TRAIN
        gpus = {0, 1} if jid == 11 else ({0} if phase is Phase.ROLLOUT else {1})
        lid = _grant(store, p1, jid, phase, gpus, t - 1, t)
        store.lease_ended(lid, LeaseState.REVOKED if k == 5 else LeaseState.RELEASED,
                          t + 10)
        if jid == 11:
            store.add_observation(job_id=11, phase=Phase.REWARD, requested_at=t + 10,
                                  granted_at=t + 10, released_at=t + 11,
                                  detail={"step": k, "reward": 0.1 * k})
        t += 10
    _grant(store, p1, 11, Phase.ROLLOUT, {0, 1}, 1061.0, 1062.0)  # held, not released
    lid = store.add_request(pool_id=p1, job_id=12, phase=Phase.ROLLOUT, wanted={0},
                            min_gpus=1, requested_at=1063.0, deadline_at=1200.0)
    store.lease_ended(lid, LeaseState.CANCELLED, 1064.0)
    _grant(store, p2, 13, Phase.TRAIN, {0}, 1000.0, 1001.0)  # held, not released
    store.close()
    return path


def _read(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    header, *rows = (json.loads(ln) for ln in path.read_text().splitlines())
    return header, rows


def test_trace_has_the_ended_leases_and_replays(tmp_path: Path) -> None:
    db, out = _db(tmp_path / "c.db"), tmp_path / "t.jsonl"
    res = CliRunner().invoke(report, ["--db", str(db), "--trace", str(out)])
    assert res.exit_code == 0, res.output
    assert f"trace of 6 leases (2 jobs) written to {out}" in res.output
    assert "no ended lease, left out of the trace: job 13" in res.output
    header, rows = _read(out)
    assert header == {"format": "slurmrl-trace/1", "jobs": [
        {"job_id": 11, "gpus": 2, "layout": "colocated", "model": "Qwen2.5-0.5B",
         "user": "user11", "pool": 1, "pool_gpus": 2,
         "profile": "rollout=0.5,train=0.5,step=30", "max_slowdown": 1.3, "steps": 400},
        {"job_id": 12, "gpus": 2, "layout": "disaggregated", "rollout_gpus": 1,
         "model": "tiny", "user": "user12", "pool": 1, "pool_gpus": 2}]}
    # six ended leases in request order; the held lease, the cancelled request and
    # the reward gaps are not leases a replay can rebuild
    assert [(r["job_id"], r["phase"]) for r in rows] == [
        (11, "rollout"), (12, "rollout"), (11, "train"), (12, "train"), (11, "rollout"),
        (12, "rollout")]
    assert rows[1] == {"job_id": 12, "phase": "rollout", "requested_at": 1009.0,
                       "granted_at": 1010.0, "released_at": 1020.0, "gpus": [0]}
    assert all(r["released_at"] <= 1060.0 for r in rows)
    rep = replay(out)
    assert rep["recorded_makespan_s"] == pytest.approx(61.0)
    assert rep["predicted_makespan_s"] > 0
    # placed anew by a policy (`simulate -w FILE.jsonl`), a job keeps what its user asked
    jobs = {j.job_id: j for j in trace_jobs(out)}
    assert jobs[11].prior == PhasePrior(((Phase.ROLLOUT, 0.5), (Phase.TRAIN, 0.5)), 30.0)
    assert jobs[11].max_slowdown == 1.3 and jobs[12].prior is None
    # the --rl-steps it declared, not the 2 steps the trace recorded of it
    assert jobs[11].declared_steps == 400 and jobs[12].declared_steps is None
    assert jobs[12].rollout_gpus == 1 and not jobs[12].mux_off


def test_trace_of_selected_jobs_only_in_the_json_envelope(tmp_path: Path) -> None:
    db, out = _db(tmp_path / "c.db"), tmp_path / "t.jsonl"
    res = CliRunner().invoke(report, ["--db", str(db), "-j", "12", "--json",
                                      "--trace", str(out)])
    assert res.exit_code == 0, res.output
    env = json.loads(res.output)
    assert env["trace"] == {"path": str(out), "leases": 3, "jobs": 1}
    assert env["meta"]["query"]["trace"] == str(out) and env["errors"] == []
    header, rows = _read(out)
    assert [j["job_id"] for j in header["jobs"]] == [12]
    assert {r["job_id"] for r in rows} == {12} and len(rows) == 3
    assert replay(out)["recorded_makespan_s"] == pytest.approx(1060.0 - 1009.0)


def test_package_function_takes_a_store_or_a_path(tmp_path: Path) -> None:
    db = _db(tmp_path / "c.db")
    assert write_trace(db, tmp_path / "a.jsonl", [11]) == 3
    store = Store(db)
    try:
        assert write_trace(store, tmp_path / "b.jsonl") == 6
    finally:
        store.close()
    assert _read(tmp_path / "b.jsonl")[1][0]["job_id"] == 11
    with pytest.raises(TraceError, match="no ended leases recorded for job 13"):
        write_trace(db, tmp_path / "c.jsonl", [13])
    with pytest.raises(SourceError, match="no colocation DB"):
        write_trace(tmp_path / "none.db", tmp_path / "d.jsonl")
    assert not (tmp_path / "c.jsonl").exists() and not (tmp_path / "d.jsonl").exists()
    assert not (tmp_path / "none.db").exists()


def test_bad_cases_say_what_is_wrong_and_write_nothing(tmp_path: Path) -> None:
    runner = CliRunner()
    db, out = _db(tmp_path / "c.db"), tmp_path / "t.jsonl"
    # only a lease still held: nothing to replay
    res = runner.invoke(report, ["--db", str(db), "-j", "13", "--trace", str(out)])
    assert res.exit_code == 1 and "no ended leases recorded for job 13" in res.output
    assert not out.exists()
    # an earlier trace at the path is left as it was
    out.write_text("earlier\n")
    res = runner.invoke(report, ["--db", str(db), "-j", "13", "--json", "--trace", str(out)])
    assert res.exit_code == 1
    assert "no ended leases" in json.loads(res.stdout)["errors"][0]
    assert out.read_text() == "earlier\n"
    out.unlink()
    res = runner.invoke(report, ["--db", str(tmp_path / "nope.db"), "--trace", str(out)])
    assert res.exit_code == 1 and "no colocation DB at" in res.output
    assert not out.exists() and not (tmp_path / "nope.db").exists()
    bad = tmp_path / "missing-dir" / "t.jsonl"
    res = runner.invoke(report, ["--db", str(db), "--trace", str(bad)])
    assert res.exit_code == 1 and f"cannot write trace {bad}" in res.output
    assert not bad.parent.exists()
    res = runner.invoke(report, ["--db", str(db), "--trace", str(tmp_path)])
    assert res.exit_code == 2 and "directory" in res.output
    res = runner.invoke(report, ["--controller", "http://h:1", "--trace", str(out)])
    assert res.exit_code == 2 and "--trace reads the colocation DB" in res.output
    # a failing baseline fails the command before the trace is written
    res = runner.invoke(report, ["--db", str(db), "--baseline", str(tmp_path / "no.json"),
                                 "--trace", str(out)])
    assert res.exit_code == 1 and not out.exists()
    # and no temporary file is left beside any target
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith("c.db")] == []


def test_a_write_failing_midway_leaves_the_earlier_file_whole(tmp_path: Path) -> None:
    # a real short write: the file-size limit makes the trace's write fail with EFBIG
    db, out = _db(tmp_path / "c.db"), tmp_path / "t.jsonl"
    out.write_text("earlier\n")
    store = Store(db)
    try:
        trace = build_trace(store)
    finally:
        store.close()
    old_sig = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    old_lim = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (300, old_lim[1]))
    try:
        with pytest.raises(TraceError, match=re.escape(f"cannot write trace {out}")):
            save_trace(trace, out)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_lim)
        signal.signal(signal.SIGXFSZ, old_sig)
    assert out.read_text() == "earlier\n"
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith("c.db")] == ["t.jsonl"]
    save_trace(trace, out)  # the same trace under no limit is written whole
    assert len(_read(out)[1]) == 6


def test_a_trace_or_plot_over_the_db_is_refused_and_the_db_kept(tmp_path: Path) -> None:
    # `--trace c.db` replaced the DB with the trace (and exited 0): the record was gone
    db = _db(tmp_path / "c.db")
    before = db.read_bytes()
    for flag, path in (("--trace", db), ("--trace", tmp_path / "." / "c.db"),
                       ("--plot", tmp_path / "c.db.png")):
        if flag == "--plot":  # a PNG path naming the baseline file
            (tmp_path / "c.db.png").write_bytes(b'{"j11": 100.0}')
            args = ["--db", str(db), "--baseline", str(path), "--plot", str(path)]
        else:
            args = ["--db", str(db), flag, str(path)]
        res = CliRunner().invoke(report, args)
        assert res.exit_code == 2, res.output
        assert f"{flag} {path} is the" in res.output and "overwritten" in res.output
    assert db.read_bytes() == before
    assert (tmp_path / "c.db.png").read_bytes() == b'{"j11": 100.0}'


def test_a_report_whose_plot_fails_writes_no_trace(tmp_path: Path) -> None:
    db, out = _db(tmp_path / "c.db"), tmp_path / "t.jsonl"
    res = CliRunner().invoke(report, ["--db", str(db), "--trace", str(out),
                                      "--plot", str(tmp_path / "no" / "such" / "t.png")])
    assert res.exit_code == 1 and "cannot write" in res.output
    assert not out.exists()


# -- a job's --rl-profile comes back from the trace as it was parsed -----------------------

def _profiles_at_the_bounds() -> list[str]:
    """The --rl-profile values of tests/data/directives.toml's valid cases, and values at
    the parser's bounds: shares in (0,1] and step in (0,STEP_MAX_S], each of at most 16
    characters, so at most 15 significant digits."""
    cases = tomllib.loads((Path(__file__).parents[1] / "data" / "directives.toml")
                          .read_text())
    written = [c["options"]["rl-profile"] for c in cases["valid"]
               if "rl-profile" in c["options"]]
    assert written  # the table still has some
    step_max = f"{STEP_MAX_S:.0f}"  # 1000000 (:g wrote 1e+06, which the parser refuses)
    return [*written,
            f"rollout=1,step={step_max}",
            "rollout=0.99995,idle=0.00005,step=0.00000000000001",  # 5e-05 and 1e-14
            "rollout=0.99999999999999,idle=0.00000000000001,step=999999.999999999",
            "rollout=0.123456789012,train=0.876543210988,step=123456.789",  # > 6 digits
            "rollout=00.25,train=0.2500,sync=0.1,reward=0.3,idle=0.1,step=060.50",
            "train=1.0,step=0.5"]


@pytest.mark.parametrize("written", _profiles_at_the_bounds())
def test_a_profile_the_parser_accepts_comes_back_identical(written: str) -> None:
    prior = parse_profile(written)
    text = profile_text(prior)
    for item in text.split(","):  # plain decimals, as the plugin takes them: no exponent
        assert re.fullmatch(r"[a-z]+=[0-9]+(\.[0-9]+)?", item), text
    assert parse_profile(text) == prior
    assert len(text) <= len(written)  # within the parser's length limit too


def test_a_trace_of_jobs_with_profiles_at_the_bounds_replays_them_identical(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "c.db")
    pool = store.add_pool(gpus=1, opened_at=0.0, slurm_job_id=9)
    priors = {jid: parse_profile(w) for jid, w in enumerate(_profiles_at_the_bounds(), 20)}
    t = 10.0
    for jid, prior in priors.items():
        store.add_job(JobRecord(jid, "u", 2000, RlRequest(gpus=1, profile=prior),
                                JobState.RUNNING, 0.0, name="j", pool_id=pool,
                                pool_gpus=(0,)))
        store.lease_ended(_grant(store, pool, jid, Phase.ROLLOUT, {0}, t - 1, t),
                          LeaseState.RELEASED, t + 5)
        t += 10
    out = tmp_path / "t.jsonl"
    assert write_trace(store, out) == len(priors)
    store.close()
    assert {j.job_id: j.prior for j in trace_jobs(out)} == priors


# -- a recorded pool replays as it ran: its GPUs, floating, staggered, partly traced -------

def _floating_db(path: Path) -> Path:
    """A floating pool of two 1-GPU windows and three 1-GPU members, each asking for 4
    rollouts of 10 s, 10 s apart; a rollout takes whichever window frees first."""
    store = Store(path)
    pool = store.add_pool(gpus=2, opened_at=0.0, slurm_job_id=9, floating=True)
    for w in (0, 1):
        store.add_window(pool_id=pool, window=w, slurm_job_id=9 + w, gpu_indices=[w],
                         opened_at=0.0)
    for jid in (1, 2, 3):
        store.add_job(JobRecord(jid, "u", 100 + jid, RlRequest(gpus=1), JobState.COMPLETED,
                                0.0, name=f"j{jid}", pool_id=pool, pool_gpus=(0,)))
    free = {0: 0.0, 1: 0.0}  # when each window is next free
    asks = {j: 0.0 for j in (1, 2, 3)}  # when each job next asks
    left = {j: 4 for j in (1, 2, 3)}
    while any(left.values()):
        jid = min((j for j in left if left[j]), key=lambda j: (asks[j], j))
        w = min(free, key=lambda w: (max(free[w], asks[jid]), w))
        granted = max(asks[jid], free[w])
        store.lease_ended(_grant(store, pool, jid, Phase.ROLLOUT, {w}, asks[jid], granted),
                          LeaseState.RELEASED, granted + 10)
        free[w], asks[jid], left[jid] = granted + 10, granted + 20, left[jid] - 1
    store.close()
    return path


def _staggered_db(path: Path) -> Path:
    """A fixed pool of 2 GPUs whose two 1-GPU members each ran on its own GPU, never
    waiting for the other."""
    store = Store(path)
    pool = store.add_pool(gpus=2, opened_at=990.0, slurm_job_id=9)
    for jid, gpu in ((21, 0), (22, 1)):
        store.add_job(JobRecord(jid, "u", 3000 + jid, RlRequest(gpus=1), JobState.COMPLETED,
                                990.0, name=f"j{jid}", pool_id=pool, pool_gpus=(gpu,)))
        t = 1000.0
        for k in range(4):
            phase = Phase.ROLLOUT if k % 2 == 0 else Phase.TRAIN
            store.lease_ended(_grant(store, pool, jid, phase, {gpu}, t, t),
                              LeaseState.RELEASED, t + 10)
            t += 12
    store.close()
    return path


def test_a_floating_pool_is_traced_and_replayed_as_it_ran(tmp_path: Path) -> None:
    # replayed as a fixed pool of one job's GPU, the three members queued for one GPU:
    # predicted 121 s for the recorded 80 s (+51%)
    out = tmp_path / "t.jsonl"
    assert write_trace(_floating_db(tmp_path / "c.db"), out) == 12
    header, _ = _read(out)
    assert [(j["pool"], j["pool_gpus"], j["floating"]) for j in header["jobs"]] == [
        (1, 2, True)] * 3
    rep = replay(out)
    assert rep["recorded_makespan_s"] == 80.0
    assert abs(rep["error"]) < 0.02


def test_a_floating_pool_exports_the_most_windows_it_held_at_once(tmp_path: Path) -> None:
    # its record's `gpus` is its size when last changed: one window once two went back
    store = Store(tmp_path / "c.db")
    pool = store.add_pool(gpus=1, opened_at=0.0, slurm_job_id=9, floating=True)
    wins = [store.add_window(pool_id=pool, window=w, slurm_job_id=9 + w, gpu_indices=[w],
                             opened_at=at) for w, at in ((0, 0.0), (1, 5.0), (2, 20.0))]
    store.close_window(wins[1], 20.0)  # window 2 opens as 1 closes: 2 at once, not 3
    store.close_window(wins[2], 30.0)
    store.add_job(JobRecord(1, "u", 101, RlRequest(gpus=1), JobState.COMPLETED, 0.0,
                            pool_id=pool, pool_gpus=(0,)))
    store.lease_ended(_grant(store, pool, 1, Phase.ROLLOUT, {0}, 1.0, 1.0),
                      LeaseState.RELEASED, 2.0)
    spec = build_trace(store).header["jobs"][0]
    store.close()
    assert (spec["pool_gpus"], spec["floating"]) == (2, True)


def test_a_staggered_pool_replays_each_member_on_its_own_gpus(tmp_path: Path) -> None:
    # replayed as one job's GPU, the two members took turns: +75%
    out = tmp_path / "t.jsonl"
    write_trace(_staggered_db(tmp_path / "c.db"), out)
    header, _ = _read(out)
    assert [(j["pool_gpus"], j.get("gpu_offset"), "floating" in j)
            for j in header["jobs"]] == [(2, None, False), (2, 1, False)]
    assert replay(out)["error"] == pytest.approx(0.0, abs=0.02)


def test_a_trace_keeps_each_jobs_rl_group(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.db")
    pool = store.add_pool(gpus=1, opened_at=0.0, slurm_job_id=9)
    for jid, group in ((1, "teamA"), (2, None)):
        store.add_job(JobRecord(jid, "u", 101, RlRequest(gpus=1, group=group),
                                JobState.COMPLETED, 0.0, pool_id=pool, pool_gpus=(0,)))
        store.lease_ended(_grant(store, pool, jid, Phase.ROLLOUT, {0}, jid, jid),
                          LeaseState.RELEASED, jid + 0.5)
    out = tmp_path / "t.jsonl"
    write_trace(store, out)
    store.close()
    assert [j.get("group") for j in _read(out)[0]["jobs"]] == ["teamA", None]
    assert [j.group for j in trace_jobs(out)] == ["teamA", None]


def test_a_pool_traced_without_some_members_is_named(tmp_path: Path) -> None:
    # two 2-GPU jobs that took turns in one pool, each waiting 10 s for the other's
    # phase: job 2 replayed alone waits for no one (error -0.50), and nothing said why
    store = Store(tmp_path / "c.db")
    pool = store.add_pool(gpus=2, opened_at=0.0, slurm_job_id=9)
    for jid in (1, 2):
        store.add_job(JobRecord(jid, "u", 100 + jid, RlRequest(gpus=2), JobState.COMPLETED,
                                0.0, name=f"j{jid}", pool_id=pool, pool_gpus=(0, 1)))
    for k, phase in enumerate((Phase.ROLLOUT, Phase.TRAIN, Phase.ROLLOUT)):
        for jid, asked, granted in ((1, max(0, 20 * k - 10), 20 * k),
                                    (2, 20 * k, 20 * k + 10)):
            store.lease_ended(_grant(store, pool, jid, phase, {0, 1}, asked, granted),
                              LeaseState.RELEASED, granted + 10)
    assert build_trace(store).warnings == ()
    trace = build_trace(store, [2])
    store.close()
    said = "pool 1's member 1 is not in the trace: the replay runs job 2 without it"
    assert trace.warnings == (said,) and trace.header["warnings"] == [said]
    out = tmp_path / "t.jsonl"
    save_trace(trace, out)
    res = CliRunner().invoke(simulate, ["--replay", str(out), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["warnings"] == [said], res.output
    res = CliRunner().invoke(simulate, ["--replay", str(out)])
    assert res.exit_code == 0 and f"warning: {said}" in res.stderr
    # and `slurmrl report --trace` says it as it writes the trace
    res = CliRunner().invoke(report, ["--db", str(tmp_path / "c.db"), "-j", "2", "--json",
                                      "--trace", str(tmp_path / "r.jsonl")])
    assert res.exit_code == 0 and said in json.loads(res.stdout)["warnings"], res.output
