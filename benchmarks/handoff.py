"""Handoff cost on the real local Slurm: resident services vs relaunch per phase.

Two RL jobs (a driver job of rlalice and one of rlbob, `sleep` in the drivers partition)
share one pool of 4 fake GPUs opened by the real pool manager (`SlurmPools`), which
launches their `tiny` services as steps of the pool, as their users. The benchmark
drives the real controller objects (Store, lease scheduler, pool manager) in-process —
the RPC and MUNGE are left out (docs/benchmarks.md "Lease latency" has their cost) —
and alternates rollout leases between the jobs. For each handoff it measures, from the
moment the holder releases until the next job's first `generate` has returned:

- controller: release -> grant (lease scheduler, DB commit) plus the residency plan;
- park: parking the previous holder's services (control-plane HTTP to the worker);
- activate: activating the next job's rollout;
- first call: the next job's first `generate` (4 prompts, 8 tokens).

Beside it, in the same run and pool, the relaunch-per-phase baseline: at each handoff a
new `srun --overlap` step is launched for the next job's rollout (model load included)
and the previous one stopped — what a pool without resident services would pay.

Prints p50/p95/max milliseconds; asserts nothing. Run as root on the dev cluster:
    SLURM_CONF=/var/lib/slurmrl-dev/etc/slurm.conf \
        /opt/slurmrl/venv/bin/python benchmarks/handoff.py [--handoffs 20] [--relaunches 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from slurmrl.config import Config  # noqa: E402
from slurmrl.config.schema import ControllerConfig  # noqa: E402
from slurmrl.controller.core import Controller  # noqa: E402
from slurmrl.controller.pools import SlurmPools  # noqa: E402
from slurmrl.controller.services import RunningService, ServiceSpec  # noqa: E402
from slurmrl.db import Store  # noqa: E402
from slurmrl.model import Identity, JobState, Phase  # noqa: E402
from slurmrl.slurm import BatchSpec, CommandBackend  # noqa: E402
from slurmrl.worker.handle import ServiceHandle  # noqa: E402

PROMPTS = ["1+2=", "3*4=", "9-7=", "5+5="]
USERS = ("rlalice", "rlbob")


def ms(xs: list[float]) -> str:
    s = sorted(xs)
    p95 = s[min(len(s) - 1, round(0.95 * (len(s) - 1)))]
    return f"{statistics.median(s) * 1e3:9.1f} {p95 * 1e3:9.1f} {s[-1] * 1e3:9.1f}"


async def main(handoffs: int, relaunches: int) -> None:
    slurm = CommandBackend()
    work = Path(tempfile.mkdtemp(prefix="slurmrl-handoff-"))
    os.chmod(work, 0o711)
    cfg = Config(controller=ControllerConfig(db_path=str(work / "c.db"), lease_timeout_s=60))
    store = Store(cfg.controller.db_path)
    pools = SlurmPools(run_dir=str(work / "services"), bind_host="127.0.0.1")
    c = Controller(cfg, store, slurm, pools=pools)
    await c.start()
    drivers: list[int] = []
    try:
        for user in USERS:
            drivers.append(slurm.submit(BatchSpec(
                command=("sleep", "3600"), uid=user, name="handoff-bench",
                output="/dev/null", partition="drivers")))
        jobs = []
        for jid in drivers:
            while (info := slurm.job(jid)) is None or info.state.value != "RUNNING":
                await asyncio.sleep(0.2)
            jobs.append(await c.register(Identity(info.uid, info.uid, info.user), jid,
                                         {"SLURMRL_GPUS": "4", "SLURMRL_MODEL": "tiny"}))
        t_place = time.perf_counter()
        for jid in drivers:
            while (j := c.store.job(jid)) is None or j.pool_id is None:
                await asyncio.sleep(0.2)
        print(f"placed both jobs (pool opened, 4 services launched) in "
              f"{time.perf_counter() - t_place:.1f} s")
        handles = {}
        for jid in drivers:
            job = c.store.job(jid)
            assert job is not None
            svc = next(s for s in c.store.services(job_id=jid, live_only=True)
                       if s.role == "rollout")
            handles[jid] = ServiceHandle(svc.address, job.secret, str(jid), "rollout")

        # resident services: alternate rollout leases
        rows: dict[str, list[float]] = {k: [] for k in
                                        ("controller", "park", "activate", "call", "total")}
        holder = c.store.job(drivers[0])
        assert holder is not None
        ticket = c.scheduler.request(holder, Phase.ROLLOUT)
        assert ticket.lease is not None
        await pools.before_answer(holder, ticket.lease)
        held = ticket.lease
        for i in range(handoffs):
            nxt = c.store.job(drivers[(i + 1) % 2])
            assert nxt is not None
            waiting = c.scheduler.request(nxt, Phase.ROLLOUT)
            assert waiting.lease is None
            waiter = asyncio.create_task(c.scheduler.wait(waiting.request_id, 30))
            await asyncio.sleep(0.01)
            t0 = time.perf_counter()
            c.scheduler.release(holder, held.lease_id, {})
            lease = await waiter
            assert lease is not None
            t_grant = time.perf_counter()
            await pools.before_answer(nxt, lease)
            t_ready = time.perf_counter()
            await asyncio.to_thread(handles[nxt.job_id].generate, PROMPTS, max_tokens=8)
            t_done = time.perf_counter()
            h = pools.handoffs[-1]
            assert h.lease_id == lease.lease_id and h.parked, "the holder was not parked"
            rows["controller"].append(t_grant - t0 + h.plan_s)
            rows["park"].append(h.park_s)
            rows["activate"].append(h.activate_s)
            rows["call"].append(t_done - t_ready)
            rows["total"].append(t_done - t0)
            holder, held = nxt, lease

        # baseline: relaunch the next job's rollout as a new step at every handoff
        assert pools.launcher is not None
        pool = c.store.pool(holder.pool_id or 0)
        assert pool is not None and pool.slurm_job_id is not None
        base: dict[str, list[float]] = {"launch": [], "call": [], "total": [], "stop": []}
        prev: RunningService | None = None
        for i in range(relaunches):
            jid = drivers[i % 2]
            owner = c.store.job(jid)
            assert owner is not None
            t0 = time.perf_counter()
            if prev is not None:
                t_stop = time.perf_counter()
                await asyncio.to_thread(pools.launcher.stop, prev)
                base["stop"].append(time.perf_counter() - t_stop)
            t1 = time.perf_counter()
            fresh = await asyncio.to_thread(
                pools.launcher.launch, pool.slurm_job_id, pool.nodes[0],
                ServiceSpec(jid + 1_000_000, "rollout", owner.user, (0, 1, 2, 3)),
                owner.secret)
            t2 = time.perf_counter()
            await asyncio.to_thread(fresh.handle.generate, PROMPTS, max_tokens=8)
            t3 = time.perf_counter()
            base["launch"].append(t2 - t1)
            base["call"].append(t3 - t2)
            base["total"].append(t3 - t0)
            prev = fresh
        if prev is not None:
            await asyncio.to_thread(pools.launcher.stop, prev)

        print(f"\nhandoff, release -> next job's first generate done ({handoffs} handoffs, "
              f"{relaunches} relaunches; {platform.node()}, {os.cpu_count()} CPUs, "
              f"tiny backend on CPU, fake GPUs)")
        print(f"{'':38} {'p50 ms':>9} {'p95 ms':>9} {'max ms':>9}")
        print(f"{'resident: controller (grant + plan)':38} {ms(rows['controller'])}")
        print(f"{'resident: park previous holder':38} {ms(rows['park'])}")
        print(f"{'resident: activate next rollout':38} {ms(rows['activate'])}")
        print(f"{'resident: first generate':38} {ms(rows['call'])}")
        print(f"{'resident: total':38} {ms(rows['total'])}")
        print(f"{'relaunch: stop previous step':38} {ms(base['stop'] or [0.0])}")
        print(f"{'relaunch: new srun step + model load':38} {ms(base['launch'])}")
        print(f"{'relaunch: first generate':38} {ms(base['call'])}")
        print(f"{'relaunch: total':38} {ms(base['total'])}")
        print(f"\nrelaunch/resident total (p50): "
              f"{statistics.median(base['total']) / statistics.median(rows['total']):.0f}x")
    finally:
        for jid in drivers:
            slurm.cancel(jid)
        for jid in drivers:
            await c.end_job(jid, JobState.CANCELLED, "benchmark done")
        await c.stop()
        for p in c.store.pools():
            if p.slurm_job_id is not None:
                slurm.cancel(p.slurm_job_id)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--handoffs", type=int, default=20)
    ap.add_argument("--relaunches", type=int, default=5)
    a = ap.parse_args()
    asyncio.run(main(a.handoffs, a.relaunches))
