"""The lease RPC's inputs as a caller sends them (the two-user rig): a POST's query
string, an acquire's `min_gpus`, and a job's phase after its lease lapses."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from _loop import Clock
from test_server_two_users import ALICE, BOB, A, B, _frame, _pool_of_both, _stream, rig

from slurmrl.model import LeaseState


def test_a_post_with_a_query_string_is_a_400_naming_it_and_changes_nothing(
        tmp_path: Path) -> None:
    # POSTs ignored their query strings, even a parameter given twice: a caller's
    # `?wait_s=0` went unheeded, the request queued on the body's wait
    async def main() -> None:
        async with rig(tmp_path) as r:
            _pool_of_both(r)
            status, held = await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases",
                                        {"phase": "train", "wait_s": 0})
            assert status == 200
            lid = held["lease"]["lease_id"]
            refused = [
                await r.call(BOB, "POST", f"/v1/jobs/{B}/leases?wait_s=0&wait_s=1&bogus=1",
                             {"phase": "train", "wait_s": 0}),
                await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases/{lid}/release?keep=1", {}),
                await r.call(ALICE, "POST", f"/v1/jobs/{A}/heartbeat?x=1", {}),
                await r.call(ALICE, "POST", f"/v1/jobs/{A}/end?state=CD", {}),
            ]
            for status, answer in refused:
                assert status == 400 and answer["error"]["code"] == "unknown-field", answer
            assert refused[0][1]["error"]["message"] == (
                "unknown query parameter(s) bogus, wait_s; accepted: (none)")
            assert "keep" in refused[1][1]["error"]["message"]
            assert [(x.lease_id, x.state) for x in r.c.store.leases()] == [
                (lid, LeaseState.HELD)]
            job = r.c.store.job(A)
            assert job is not None and not job.state.terminal

    asyncio.run(main())


def test_a_min_gpus_out_of_range_is_a_400_bad_value_before_any_join(tmp_path: Path) -> None:
    # it was a 409 lease-conflict from the scheduler, and a retry that joined the job's
    # held lease answered 200 whatever its min_gpus; before placement, 202 unplaced
    async def main() -> None:
        async with rig(tmp_path) as r:
            status, unplaced = await r.call(BOB, "POST", f"/v1/jobs/{B}/leases",
                                            {"phase": "train", "min_gpus": 3, "wait_s": 0})
            assert (status, unplaced["error"]["code"]) == (400, "bad-value"), unplaced
            _pool_of_both(r)
            status, held = await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases",
                                        {"phase": "train", "wait_s": 0})
            assert status == 200
            status, joined = await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases",
                                          {"phase": "train", "min_gpus": 5, "wait_s": 0})
            assert status == 400 and joined["error"] == {
                "code": "bad-value", "message": "min_gpus must be between 1 and 2, got 5"}
            status, fresh = await r.call(BOB, "POST", f"/v1/jobs/{B}/leases",
                                         {"phase": "rollout", "min_gpus": 3, "wait_s": 0})
            assert (status, fresh["error"]["code"]) == (400, "bad-value")
            ws = await _stream(r, BOB)  # the stream's acquire says the same
            await ws.send_str(json.dumps({"id": 1, "op": "acquire", "job_id": B,
                                          "phase": "rollout", "min_gpus": 3, "wait_s": 0}))
            frame = await _frame(ws)
            assert (frame["status"], frame["error"]["code"]) == (400, "bad-value"), frame
            await ws.close()
            assert [x.lease_id for x in r.c.store.leases()] == [held["lease"]["lease_id"]]

    asyncio.run(main())


def test_a_min_gpus_in_a_floating_pool_is_a_400_bad_value(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path, register=((ALICE, A),)) as r:
            pool = r.c.open_pool(gpus=2, slurm_job_id=777, floating=True)
            r.c.place_job(A, pool.pool_id, (0, 1))
            status, answer = await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases",
                                          {"phase": "rollout", "min_gpus": 1, "wait_s": 0})
            assert (status, answer["error"]["code"]) == (400, "bad-value"), answer
            assert "floating pool" in answer["error"]["message"]
            assert r.c.store.leases() == []
            status, _ = await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases",
                                     {"phase": "rollout", "min_gpus": 2, "wait_s": 0})
            assert status == 200  # a whole window

    asyncio.run(main())


def test_a_min_gpus_below_a_services_gpus_is_a_400_bad_value(tmp_path: Path) -> None:
    # a lease on part of a one-engine service's GPUs was granted, and its handoff ran
    # that service on GPUs another job held; a rollout run as replicas takes whole ones
    async def main() -> None:
        async with rig(tmp_path) as r:
            pool_id = _pool_of_both(r)
            for job, role, gpus in ((A, "rollout", (0, 1)), (A, "trainer", (0, 1)),
                                    (B, "rollout", (0,)), (B, "rollout", (1,)),
                                    (B, "trainer", (0, 1))):
                r.c.store.add_service(job_id=job, role=role, started_at=0.0,
                                      pool_id=pool_id, gpus=gpus, state="running")
            for who, job, phase in ((ALICE, A, "rollout"), (ALICE, A, "train"),
                                    (BOB, B, "train")):
                status, answer = await r.call(who, "POST", f"/v1/jobs/{job}/leases",
                                              {"phase": phase, "min_gpus": 1, "wait_s": 0})
                assert (status, answer["error"]["code"]) == (400, "bad-value"), answer
                assert "cannot run on part of them" in answer["error"]["message"]
            assert r.c.store.leases() == []
            status, _ = await r.call(BOB, "POST", f"/v1/jobs/{B}/leases",
                                     {"phase": "rollout", "min_gpus": 1, "wait_s": 0})
            assert status == 200  # whole replicas

    asyncio.run(main())


def test_a_job_whose_lease_lapsed_is_idle(tmp_path: Path) -> None:
    # its phase (`slurmrl status`'s PHASE) stayed "train" on a lease revoked by expiry
    async def main() -> None:
        clock = Clock()
        async with rig(tmp_path, clock=clock) as r:
            _pool_of_both(r)
            status, held = await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases",
                                        {"phase": "train", "wait_s": 0})
            assert status == 200
            _, job = await r.call(ALICE, "GET", f"/v1/jobs/{A}")
            assert job["job"]["phase"] == "train"
            clock.now += r.c.config.controller.lease_timeout_s + 1
            r.c.scheduler.expire()
            lease = r.c.store.lease(held["lease"]["lease_id"])
            assert lease is not None and lease.state is LeaseState.REVOKED
            _, job = await r.call(ALICE, "GET", f"/v1/jobs/{A}")
            assert job["job"]["phase"] == "idle"  # as after a release
            await r.call(ALICE, "POST", f"/v1/jobs/{A}/end", {})
            ended = r.c.store.job(A)
            assert ended is not None and ended.phase is None

    asyncio.run(main())
