"""Every recorded/reconstructed Slurm output parses to the same JobInfo/NodeInfo values.

Fixtures: tests/fixtures/slurm/<version>/ (README.md there says which were recorded live
and which were reconstructed from Slurm's data_parser sources).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmrl.slurm import JobInfo, NodeInfo, SlurmJobState
from slurmrl.slurm import parse as p

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"
RECONSTRUCTED = ["23.02", "23.11", "24.05", "24.11", "25.05", "25.11"]

S = SlurmJobState
EXPECTED_JOBS = [
    JobInfo(101, "driver", "alice", 1001, S.RUNNING, "", "drivers", ("localhost",), (), (),
            1700000000.0, 1700003600.0, "rl job", "localhost", 0, None, 60),
    JobInfo(102, "pool", "root", 0, S.RUNNING, "", "pools", ("localhost",), (0, 1),
            (("localhost", (0, 1)),), 1700000100.0, None, "", "localhost", 0, None, None),
    JobInfo(103, "done", "alice", 1001, S.FAILED, "", "drivers", ("localhost",), (), (),
            1700000000.0, 1700000050.0, "", "localhost", 3, None, 10),
    JobInfo(104, "waiting", "bob", 1002, S.PENDING, "Resources", "pools", (), (), (),
            None, None, "", "", 0, None, 30),
    JobInfo(105, "ending", "bob", 1002, S.COMPLETING, "", "pools", ("localhost",), (3,),
            (("localhost", (3,)),), 1700000200.0, 1700000300.0, "", "localhost", 0, None, 30,
            S.COMPLETED),
    JobInfo(106, "killed", "alice", 1001, S.CANCELLED, "", "drivers", ("localhost",), (), (),
            1700000000.0, 1700000010.0, "", "localhost", None, 9, 10),
]
EXPECTED_NODE = NodeInfo("localhost", "MIXED", 4, 8, 16000, ("drivers", "pools"), "127.0.0.1",
                         (("", 4),))


def load(version: str, name: str) -> object:
    return json.loads((FIX / version / name).read_text())


@pytest.mark.parametrize("version", RECONSTRUCTED)
def test_squeue_json_of_every_version_gives_the_same_jobs(version: str) -> None:
    assert p.jobs_from_json(load(version, "squeue.json")) == EXPECTED_JOBS


@pytest.mark.parametrize("version", RECONSTRUCTED)
def test_sinfo_json_of_every_version_gives_the_same_node(version: str) -> None:
    assert p.nodes_from_json(load(version, "sinfo.json")) == [EXPECTED_NODE]


def test_terminal_states_are_the_ended_ones() -> None:
    assert S.COMPLETED.terminal and S.CANCELLED.terminal and S.TIMEOUT.terminal
    assert not S.RUNNING.terminal and not S.COMPLETING.terminal and not S.PENDING.terminal
    assert not S.UNKNOWN.terminal


def test_a_completing_job_keeps_the_state_it_ended_in_where_slurm_says() -> None:
    # ["CANCELLED", "COMPLETING"] was COMPLETING only: a pool's loss said "ended
    # (COMPLETING)", whether it was cancelled, timed out or preempted
    assert S.parse(["CANCELLED", "COMPLETING"]) is S.COMPLETING
    assert S.ended_as(["CANCELLED", "COMPLETING"]) is S.CANCELLED
    assert S.ended_as(["COMPLETING", "TIMEOUT"]) is S.TIMEOUT
    assert S.ended_as("COMPLETING") is None  # 22.05 names no cause
    assert S.ended_as(["RUNNING", "CONFIGURING"]) is None
    assert S.ended_as(["CANCELLED"]) is None  # not completing: its state says it

    def info(state: S, reason: str = "", ended_as: S | None = None) -> JobInfo:
        return JobInfo(7, "j", "u", 1, state, reason, ended_as=ended_as)

    assert info(S.COMPLETING, ended_as=S.PREEMPTED).end_state is S.PREEMPTED
    assert info(S.COMPLETING, "TimeLimit").end_state is S.TIMEOUT  # 22.05, by its reason
    assert info(S.COMPLETING, "NodeDown").end_state is S.NODE_FAIL
    assert info(S.COMPLETING).end_state is None
    assert info(S.CANCELLED).end_state is S.CANCELLED
    assert info(S.RUNNING).end_state is None


def test_a_completing_unlimited_job_has_ended_when_its_end_time_says() -> None:
    doc = {"jobs": [{"job_id": 9, "job_state": ["CANCELLED", "COMPLETING"],
                     "time_limit": {"set": False, "infinite": True, "number": 0},
                     "end_time": {"set": True, "infinite": False, "number": 1700000300}}]}
    (job,) = p.jobs_from_json(doc)
    assert job.end_time == 1700000300.0 and job.end_state is S.CANCELLED


def test_state_from_future_slurm_is_unknown_not_a_crash() -> None:
    assert S.parse(["TELEPORTING"]) is S.UNKNOWN
    assert S.parse("CANCELLED by 0") is S.CANCELLED


def test_bad_state_shape_names_the_problem() -> None:
    with pytest.raises(p.SlurmParseError, match="job state"):
        S.parse(42)


def test_json_with_errors_raises_with_slurm_message() -> None:
    doc = {"jobs": [], "errors": [{"error": "Invalid job id specified", "error_number": 2017}]}
    with pytest.raises(p.SlurmParseError, match="Invalid job id"):
        p.jobs_from_json(doc)


def test_json_without_jobs_array_is_refused() -> None:
    with pytest.raises(p.SlurmParseError, match="no 'jobs' array"):
        p.jobs_from_json({"meta": {}})
    with pytest.raises(p.SlurmParseError, match="neither"):
        p.nodes_from_json({"meta": {}})
