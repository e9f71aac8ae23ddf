"""`slurmrl report`'s DEDIC-S: what a dedicated allocation would have cost, from a job's
first phase request (as `slurmrl status`'s DEDIC and SLOWDN), not from its registration:
a driver registers as its CPU job starts, while its pool may still wait in Slurm's queue."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from click.testing import CliRunner

from slurmrl.cli.report import JOB_COLS, report
from slurmrl.cli.status import render
from slurmrl.db import JobRecord, Store
from slurmrl.leases.types import Lease
from slurmrl.model import JobState, LeaseState, Phase, RlRequest
from slurmrl.report.compute import Hold, JobInfo, PoolInfo, ReportInput, Request, compute


def _queued() -> ReportInput:
    """Job 1 registered at 0, waited 300 s for its pool, then held both its GPUs from its
    first request (300) to its end (400); job 2 was placed at 0 and never asked for GPUs."""
    jobs = (JobInfo(1, "alice", 2, 0.0, "a", "CD", 400.0, 7),
            JobInfo(2, "alice", 2, 0.0, "b", "CD", 400.0, 8))
    holds = (Hold(1, 1, 7, 0, "rollout", 300.0, 400.0), Hold(1, 1, 7, 1, "rollout", 300.0, 400.0))
    requests = (Request(1, 1, 7, "rollout", 300.0, 300.0, 400.0),)
    return ReportInput(jobs, (PoolInfo(7, 2, 300.0, 400.0), PoolInfo(8, 2, 0.0, 400.0)),
                       holds, requests, now=500.0)


def test_time_waiting_for_a_pool_is_no_saving() -> None:
    rep = compute(_queued())
    ran, idle = rep.jobs
    assert ran.wall_s == 400.0  # WALL keeps its meaning: registration to end
    assert (ran.granted_gpu_s, ran.dedicated_gpu_s, ran.saved) == (200.0, 200.0, 0.0)  # not 75%
    # no request yet: a dedicated allocation would have cost nothing; SAVED says "-"
    assert (idle.dedicated_gpu_s, idle.saved) == (0.0, None)
    # the totals add up the rows' figures
    assert rep.totals.dedicated_gpu_s == 200.0 and rep.totals.saved == 0.0


def test_a_job_whose_requests_are_not_visible_has_no_dedicated_figure() -> None:
    data = _queued()
    theirs = JobInfo(3, None, 2, 0.0, "", "CD", 400.0, 7, visible=False)
    rep = compute(ReportInput((*data.jobs, theirs), data.pools, data.holds, data.requests,
                              now=data.now))
    assert rep.jobs[2].dedicated_gpu_s is None and rep.jobs[2].saved is None
    (row,) = render([asdict(rep.jobs[2])], JOB_COLS, False).splitlines()
    assert row.split()[6:9] == ["400s", "-", "-"]  # WALL, GPU-S, DEDIC-S
    assert rep.totals.dedicated_gpu_s == 200.0


def test_the_cli_rows_and_ledger_count_from_the_first_request(tmp_path: Path) -> None:
    """A real Store: job 21 registered at 1000, its pool opened at 1300, and it held both
    GPUs from its first request (1300) to its end (1400)."""
    store = Store(tmp_path / "c.db")
    pool = store.add_pool(gpus=2, opened_at=1300.0, slurm_job_id=9)
    store.add_job(JobRecord(21, "alice", 1001, RlRequest(gpus=2), JobState.RUNNING, 1000.0,
                            name="a", pool_id=pool, pool_gpus=(0, 1)))
    lid = store.add_request(pool_id=pool, job_id=21, phase=Phase.ROLLOUT, wanted=(0, 1),
                            min_gpus=2, requested_at=1300.0, deadline_at=1500.0)
    store.lease_granted(pool, Lease(lid, 21, Phase.ROLLOUT, frozenset({0, 1}), 1300.0,
                                    1300.0, 1500.0))
    gpu_s = store.lease_ended(lid, LeaseState.RELEASED, 1400.0)
    store.add_ledger(job_id=21, lease_id=lid, pool_id=pool, gpu_seconds=gpu_s, at=1400.0)
    store.update_job(21, state="CD", ended_at=1400.0)
    store.close()
    res = CliRunner().invoke(report, ["--db", str(tmp_path / "c.db")])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    header = lines[0].split()
    row = dict(zip(header, lines[1].split(), strict=False))
    assert (row["WALL"], row["GPU-S"], row["DEDIC-S"], row["SAVED"]) == (
        "400s", "200.0", "200.0", "0.0%")  # was 800.0 dedicated: "75.0%" saved
    (ledger,) = [x for x in lines if x.startswith("ledger:")]
    assert "granted 200.0 GPU-s" in ledger and "vs 200.0 dedicated" in ledger
    assert "saved 0.0%" in ledger


def test_a_request_recorded_before_registration_starts_the_clock_at_registration() -> None:
    data = _queued()  # job 1's first request at 300; here it registered at 350
    late = JobInfo(1, "alice", 2, 350.0, "a", "CD", 400.0, 7)
    rep = compute(ReportInput((late,), data.pools, data.holds, data.requests, now=500.0))
    assert rep.jobs[0].dedicated_gpu_s == 2 * 50.0  # never more than GPUs x wall
