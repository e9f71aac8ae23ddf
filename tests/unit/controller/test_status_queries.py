"""`slurmrl status` against the RPC app in process (test_server_two_users' rig): what its
DEDIC and SAVED count, `-j` on an ended job, `-u` with several users or uids."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from click.testing import CliRunner, Result
from test_server_two_users import ALICE, BOB, A, B, Rig, rig

from slurmrl.cli.status import JOB_FIELDS, status
from slurmrl.model import Identity


def test_dedicated_gpu_time_starts_at_the_first_phase_request_not_at_registration(
        tmp_path: Path) -> None:
    """A job registers as its CPU job starts, then waits 300 s for its pool (Slurm's
    queue, pairing): a dedicated allocation would not have cost those 300 s either."""
    clock = [1000.0]

    async def main() -> list[dict[str, Any]]:
        async with rig(tmp_path, register=((ALICE, A),), clock=lambda: clock[0]) as r:
            clock[0] += 300.0  # pending: no pool yet
            pool = r.c.open_pool(gpus=2, slurm_job_id=None)
            r.c.place_job(A, pool.pool_id, (0, 1))
            clock[0] += 20.0  # placed, its services starting: no request yet
            views = [(await r.call(ALICE, "GET", "/v1/status"))[1]["jobs"][0]]
            status_, _ = await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases",
                                      {"phase": "rollout", "wait_s": 0})
            assert status_ == 200
            clock[0] += 100.0  # it holds both GPUs all the time since
            views.append((await r.call(ALICE, "GET", "/v1/status"))[1]["jobs"][0])
            views.append((await r.call(ALICE, "GET", f"/v1/jobs/{A}"))[1]["job"])
            return views

    before, after, one = asyncio.run(main())
    saved = JOB_FIELDS["saved"][3]
    assert before["dedicated_gpu_seconds"] == 0.0 and saved(before) == "-"
    for view in (after, one):
        assert view["gpu_seconds"] == pytest.approx(200.0)
        assert view["dedicated_gpu_seconds"] == pytest.approx(200.0)  # not 2 x 420 s
        assert saved(view) == "0.0%"  # it held everything it would have had: no saving


def _qs(query: dict[str, str]) -> str:
    """`query` as the test client sends it (commas as they are), so that it is what the
    rig signs: the controller checks the signature of the path it got."""
    return urlencode(query, safe=",")


def _status_cli(r: Rig, monkeypatch: pytest.MonkeyPatch, loop: asyncio.AbstractEventLoop,
                who: Identity = ALICE) -> None:
    """`slurmrl status`'s fetch, answered by the rig's app (running on `loop`) as `who`."""
    def fetch(url: str, query: dict[str, str]) -> dict[str, Any]:
        path = "/v1/status" + (f"?{_qs(query)}" if query else "")
        code, answer = asyncio.run_coroutine_threadsafe(
            r.call(who, "GET", path), loop).result(10)
        assert code == 200, answer
        return answer

    monkeypatch.setattr("slurmrl.cli.status.fetch", fetch)


async def _invoke(*args: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, status,
                                   ["--controller", "http://ctl:1", *args])


def test_status_of_a_job_by_id_shows_it_once_ended_with_its_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bob's job, refused at registration, ended at once: he asks about it by id."""
    async def main() -> tuple[Result, Result, Result]:
        async with rig(tmp_path, register=((ALICE, A),)) as r:
            code, answer = await r.call(BOB, "POST", "/v1/jobs",
                                        {"job_id": B, "env": {"SLURMRL_GPUS": "64"}})
            assert code == 403 and answer["error"]["code"] == "admission-refused", answer
            _status_cli(r, monkeypatch, asyncio.get_running_loop(), BOB)
            return (await _invoke("-j", str(B)), await _invoke(),
                    await _invoke("-a", "-o", "jobid,st"))

    by_id, default, every = asyncio.run(main())
    assert by_id.exit_code == 0, by_id.output
    (row,) = by_id.output.splitlines()[1:]
    assert row.split()[0] == str(B) and " F " in row and "admission refused" in row
    assert [x.split()[0] for x in default.output.splitlines()[1:]] == [str(A)]  # active only
    assert [x.split() for x in every.output.splitlines()[1:]] == [
        [str(A), "PD"], [str(B), "F"]]


@pytest.mark.parametrize(("users", "listed"), [
    ("alice,bob", [A, B]), ("1001", [A]), ("alice, 1002", [A, B]), ("bob", [B]),
    ("carol,1003", [])])
def test_status_user_takes_names_and_uids_as_squeue_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, users: str, listed: list[int]) -> None:
    async def main() -> tuple[tuple[int, dict[str, Any]], Result]:
        async with rig(tmp_path) as r:
            answer = await r.call(ALICE, "GET", f"/v1/status?{_qs({'user': users})}")
            _status_cli(r, monkeypatch, asyncio.get_running_loop())
            return answer, await _invoke("-u", users, "-o", "jobid")

    # alice and bob are no users of this host (as on a login node that cannot read the
    # cluster's directory), whatever users the machine running this test has
    monkeypatch.setattr("slurmrl.cli.status._known_user", lambda name: False)
    (code, answer), res = asyncio.run(main())
    assert code == 200, answer
    assert [j["job_id"] for j in answer["jobs"]] == listed
    # each job's owner by name and uid, as squeue shows them to everyone
    assert {(j["user"], j["uid"]) for j in answer["jobs"]} <= {("alice", 1001),
                                                               ("bob", 1002)}
    assert res.exit_code == 0, res.output
    assert res.stdout.split()[1:] == [str(j) for j in listed]
    # alice and bob own jobs: not warned of, by name or uid; carol, no user and no job,
    # is
    carol = "slurmrl status: warning: -u carol: no such user on this host, and no RL job"
    assert (carol in res.stderr) == ("carol" in users)
    if listed:
        assert res.stderr == ""


@pytest.mark.parametrize("users", ["", "alice,", ",bob", "alice,,bob", " "])
def test_status_user_with_an_empty_entry_is_a_400(tmp_path: Path, users: str) -> None:
    async def main() -> tuple[int, dict[str, Any]]:
        async with rig(tmp_path) as r:
            return await r.call(BOB, "GET", f"/v1/jobs?{_qs({'user': users})}")

    code, answer = asyncio.run(main())
    assert code == 400 and answer["error"]["code"] == "bad-request", answer
    assert "comma-separated user names or uids" in answer["error"]["message"]
