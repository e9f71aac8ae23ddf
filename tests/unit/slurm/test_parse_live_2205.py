"""The Slurm 22.05 outputs recorded live on the dev cluster (tests/fixtures/slurm/22.05/).

Two things are checked: each recorded job parses to what the scenario made happen, and
`squeue --json` and `scontrol -o -d show job` of the same moment parse to identical
JobInfo values (so either path gives callers the same answer).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmrl.slurm import NodeInfo, SlurmJobState
from slurmrl.slurm import parse as p

D = Path(__file__).resolve().parents[2] / "fixtures" / "slurm" / "22.05"
SCEN = json.loads((D / "scenario.json").read_text())
IDS: dict[str, int] = SCEN["jobs"]


@pytest.fixture(autouse=True)
def utc() -> Iterator[None]:
    # scontrol prints local time; the recording was made with TZ=UTC.
    mp = pytest.MonkeyPatch()
    mp.setenv("TZ", "UTC")
    time.tzset()
    yield
    mp.undo()
    time.tzset()


def json_jobs() -> dict[int, p.JobInfo]:
    return {j.job_id: j for j in p.jobs_from_json(json.loads((D / "squeue.json").read_text()))}


def scontrol_jobs() -> dict[int, p.JobInfo]:
    text = (D / "scontrol_show_job.txt").read_text()
    return {j.job_id: j for j in (p.job_from_scontrol(r) for r in p.records(text))}


@pytest.mark.parametrize("source", [json_jobs, scontrol_jobs])
def test_recorded_jobs_show_what_the_scenario_did(source: object) -> None:
    jobs = source()  # type: ignore[operator]
    pool, driver = jobs[IDS["pool"]], jobs[IDS["driver"]]
    failed, cancelled, pending = jobs[IDS["failed"]], jobs[IDS["cancelled"]], jobs[IDS["pending"]]
    assert (pool.state, pool.partition, pool.user, pool.uid) == (
        SlurmJobState.RUNNING, "pools", "root", 0)
    assert pool.gpu_indices == (0, 1) and pool.gpu_indices_by_node == (("localhost", (0, 1)),)
    assert pool.time_limit_min is None and pool.end_time is None
    assert pool.nodes == ("localhost",) and pool.batch_host == "localhost"
    assert (driver.state, driver.user, driver.uid, driver.comment, driver.time_limit_min) == (
        SlurmJobState.RUNNING, "rlalice", 1002, "rl job", 60)
    assert driver.gpu_indices == () and driver.start_time is not None
    assert driver.end_time == driver.start_time + 3600
    assert (failed.state, failed.exit_code, failed.exit_signal, failed.reason) == (
        SlurmJobState.FAILED, 3, None, "NonZeroExitCode")
    assert (cancelled.state, cancelled.exit_signal) == (SlurmJobState.CANCELLED, 15)
    assert cancelled.state.terminal and failed.state.terminal and not pool.state.terminal
    assert (pending.state, pending.reason, pending.nodes, pending.start_time) == (
        SlurmJobState.PENDING, "Resources", (), None)
    assert (pending.user, pending.uid) == ("rlbob", 1003)


def test_squeue_json_and_scontrol_agree_on_every_job() -> None:
    a, b = json_jobs(), scontrol_jobs()
    assert set(a) == set(b) == set(IDS.values())
    for job_id in a:
        assert a[job_id] == b[job_id]


def test_node_from_sinfo_json_and_scontrol_agree() -> None:
    from_json = p.nodes_from_json(json.loads((D / "sinfo.json").read_text()))
    from_text = [p.node_from_scontrol(r)
                 for r in p.records((D / "scontrol_show_node.txt").read_text())]
    want = NodeInfo("localhost", "MIXED", 4, 16, 16000, ("drivers", "pools"), "127.0.0.1",
                    (("", 4),))
    assert from_json == from_text == [want]


def test_steps_carry_the_srun_pids_that_launched_them() -> None:
    steps = [p.step_from_scontrol(r) for r in p.records((D / "scontrol_show_step.txt").read_text())]
    assert [s.step for s in steps] == ["batch", "0", "1"]
    assert all(s.job_id == IDS["pool"] and s.state is SlurmJobState.RUNNING for s in steps)
    assert [s.srun_pid for s in steps] == [None, *SCEN["step_srun_pids"]]
    assert steps[0].number is None and steps[2].number == 1
    assert steps[1].name == "sleep" and steps[1].nodes == ("localhost",)


@pytest.mark.parametrize(("field", "forged"), [
    ("JobName=pool", "JobName=x UserId=root(0)"),  # a job name with spaces (sbatch -J)
    ("JobName=pool", "JobName=x JobState=RUNNING Partition=pools"),
    ("Comment=", "Comment=rl UserId=root(0) "),  # a free-text field after the real one
])
def test_a_record_whose_free_text_repeats_a_key_is_refused_not_guessed(
        field: str, forged: str) -> None:
    # a user's job named 'x UserId=root(0)' must not be read as root's job
    record = (D / "scontrol_show_job.txt").read_text().splitlines()[0]
    if field == "Comment=":
        record = record.replace(" Priority=", f" {forged}Priority=", 1)
    else:
        assert field in record
        record = record.replace(field, forged, 1)
    with pytest.raises(p.SlurmParseError, match="twice"):
        p.job_from_scontrol(record)
    assert p.job_from_scontrol((D / "scontrol_show_job.txt").read_text().splitlines()[0])
