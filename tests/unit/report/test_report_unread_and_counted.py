"""What `slurmrl report` shows for figures it could not read, and which jobs its ledger
counts: another user's job, read through the controller, has no lease count or waits
(its requests are its owner's to read), and a job placed that made no phase request yet
has nothing to count in the totals."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from click.testing import CliRunner

from slurmrl.cli.report import JOB_COLS, report
from slurmrl.cli.status import render
from slurmrl.db import JobRecord, Store
from slurmrl.model import JobState, RlRequest
from slurmrl.report.compute import JobInfo, PoolInfo, ReportInput, compute


def test_another_users_leases_and_waits_show_dash_not_zero() -> None:
    theirs = JobInfo(3, None, 2, 0.0, "", "CD", 400.0, 7, visible=False)
    rep = compute(ReportInput((theirs,), (PoolInfo(7, 2, 0.0, 400.0),), now=500.0))
    (job,) = rep.jobs
    assert (job.leases, job.wait) == (None, None)  # not 0 leases, 0.0 s waited
    header, row = render([asdict(job)], JOB_COLS, True).splitlines()
    cells = dict(zip(header.split(), row.split(), strict=False))
    assert [cells[k] for k in ("LEASES", "WAIT-S", "P50", "P95")] == ["-"] * 4
    (out,) = json.loads(json.dumps(rep.to_dict()))["jobs"]
    assert (out["leases"], out["wait"]) == (None, None)


def test_a_placed_job_before_its_first_request_counts_in_no_total(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.db")
    pool = store.add_pool(gpus=2, opened_at=100.0, slurm_job_id=9)
    store.add_job(JobRecord(1, "u", 1, RlRequest(gpus=2), JobState.RUNNING, 100.0,
                            name="a", pool_id=pool, pool_gpus=(0, 1)))
    store.add_job(JobRecord(2, "u", 1, RlRequest(gpus=2), JobState.PENDING, 100.0,
                            name="b"))
    store.close()
    res = CliRunner().invoke(report, ["--db", str(tmp_path / "c.db"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["totals"]["jobs"] == 0  # was 1: job 1, placed
    res = CliRunner().invoke(report, ["--db", str(tmp_path / "c.db")])
    (ledger,) = [x for x in res.output.splitlines() if x.startswith("ledger:")]
    assert ledger.startswith("ledger: 0 jobs granted 0.0 GPU-s")
    assert ("(2 more jobs not counted: never placed in a pool, before their first "
            "request, or another user's)") in ledger
