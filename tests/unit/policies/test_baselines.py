"""The baseline pairing policies on hand-built snapshots: what each promises."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from policies import registry
from policies.base import (
    Action,
    ClusterSnapshot,
    JobSnapshot,
    Placement,
    PoolSnapshot,
    SiteLimits,
    fixed_group,
)
from slurmrl.model import Mux, Phase, RlRequest
from slurmrl.profiles import profile_from_segments

GiB = 2**30


def job(jid: int, gpus: int = 8, host: int = 0, mux: Mux = Mux.AUTO,
        busy: float | None = None) -> JobSnapshot:
    """A waiting job; with `busy`, observed at that GPU duty cycle (a 100 s step)."""
    prof = None if busy is None else profile_from_segments(
        [(Phase.ROLLOUT, 100 * busy), (Phase.REWARD, 100 * (1 - busy))])
    return JobSnapshot(jid, f"u{jid}", RlRequest(gpus, "Qwen2.5-7B", mux=mux), prof,
                       float(jid), host_mem_bytes=host)


def place(name: str, waiting: Sequence[JobSnapshot], pools: Sequence[PoolSnapshot] = (),
          free: int = 64, limits: SiteLimits | None = None) -> dict[int, Placement]:
    snap = ClusterSnapshot(0.0, tuple(pools), tuple(waiting), {"pools": free},
                           limits or SiteLimits())
    return {p.job_id: p for p in registry.load("pairing", name).place(snap)}


def shared(out: dict[int, Placement], a: int, b: int) -> bool:
    """Whether jobs `a` and `b` were placed in one pool (a new one or an open one)."""
    pa, pb = out[a], out[b]
    return pa.action is not Action.WAIT and pa.action is pb.action and \
        pa.pool_id == pb.pool_id


@pytest.mark.parametrize("name", ["fifo-lock", "gang"])
def test_jobs_waiting_together_pair_in_arrival_order_with_the_next_of_their_size(
        name: str) -> None:
    # a burst of arrivals: 8-GPU jobs 1, 3, 5, 4-GPU jobs 2, 4, a --rl-mux=off job 6
    waiting = [job(1), job(2, gpus=4), job(3), job(4, gpus=4), job(5), job(6, mux=Mux.OFF)]
    out = place(name, waiting)
    assert shared(out, 1, 3) and shared(out, 2, 4)
    assert out[1].action is Action.OPEN and out[2].action is Action.OPEN
    assert not any(shared(out, 5, j) for j in (1, 2, 6))
    assert out[5].action is Action.OPEN and out[6].action is Action.DEDICATED
    # an open pool's lone member is older than the waiting jobs: it gets the first one
    pool = PoolSnapshot(7, 8, (job(0),))
    out = place(name, waiting, [pool])
    assert out[1].action is Action.JOIN and out[1].pool_id == 7
    assert shared(out, 3, 5) and not shared(out, 1, 3)
    # the second of a pair needs no GPUs of its own: 8 free GPUs hold jobs 1 and 3
    out = place(name, [job(1), job(3), job(5)], free=8)
    assert shared(out, 1, 3) and out[5].action is Action.WAIT


@pytest.mark.parametrize("name", ["fifo-lock", "gang"])
def test_fixed_pairs_respect_a_closed_pool_and_the_sites_one_job_per_pool(name: str) -> None:
    assert fixed_group(registry.load("pairing", name)) == 2
    closed = PoolSnapshot(7, 8, (job(0),), closed=True)
    assert place(name, [job(1)], [closed])[1].action is Action.OPEN
    out = place(name, [job(1), job(3)], [PoolSnapshot(7, 8, (job(0),))],
                limits=SiteLimits(max_jobs_per_pool=1))
    assert all(p.action is Action.OPEN for p in out.values()) and not shared(out, 1, 3)


@pytest.mark.parametrize("name", ["random", "fifo-lock", "gang"])
def test_baselines_keep_the_parked_state_within_host_memory(name: str) -> None:
    limits = SiteLimits(parked_host_mem_bytes=1024 * GiB)
    member = job(1, host=600 * GiB)
    pool = PoolSnapshot(7, 8, (member,), host_mem_free_bytes=424 * GiB)
    # no GPUs free: `random` joins any pool it may, so the host memory decides
    assert place(name, [job(2, host=600 * GiB)], [pool], free=0,
                 limits=limits)[2].action is Action.WAIT
    assert place(name, [job(2, host=400 * GiB)], [pool], free=0,
                 limits=limits)[2].action is Action.JOIN
    if name != "random":  # it pairs waiting jobs by a coin flip: tested below
        out = place(name, [job(2, host=600 * GiB), job(3, host=600 * GiB)], limits=limits)
        assert not shared(out, 2, 3)
        out = place(name, [job(2, host=500 * GiB), job(3, host=500 * GiB)], limits=limits)
        assert shared(out, 2, 3)


@pytest.mark.parametrize("name", ["greedy", "random"])
def test_one_at_a_time_baselines_share_a_pool_opened_in_the_same_round(name: str) -> None:
    # a burst of light jobs (duty 0.3: `greedy` packs two of them) on 8 free GPUs: the
    # first opens a pool, the next shares it (`random` packs for sure with no GPUs
    # left), the third finds it full and waits for GPUs
    waiting = [job(1, busy=0.3), job(2, busy=0.3), job(3, busy=0.3)]
    out = place(name, waiting, free=8)
    assert out[1].action is Action.OPEN and shared(out, 1, 2)
    assert out[3].action is Action.WAIT
    # not with a job of another size, nor one whose parked state would not fit
    out = place(name, [job(1, busy=0.3), job(2, gpus=4, busy=0.3)], free=12)
    assert not shared(out, 1, 2) and out[2].action is Action.OPEN
    limits = SiteLimits(parked_host_mem_bytes=1024 * GiB)
    out = place(name, [job(1, host=600 * GiB, busy=0.3), job(2, host=600 * GiB, busy=0.3)],
                free=8, limits=limits)
    assert not shared(out, 1, 2) and out[2].action is Action.WAIT
    # nor a --rl-mux=off job's dedicated pool
    out = place(name, [job(1, mux=Mux.OFF, busy=0.3), job(2, busy=0.3)], free=8)
    assert out[1].action is Action.DEDICATED and out[2].action is Action.WAIT


def test_greedy_packs_only_within_its_duty_cap() -> None:
    out = place("greedy", [job(1, busy=0.6), job(2, busy=0.6), job(3, busy=0.4)])
    assert not shared(out, 1, 2) and shared(out, 1, 3)


def test_gang_pairs_waiting_jobs_only_where_both_fit_the_partitions_gpu_memory() -> None:
    # gang holds both members' memory on the GPUs: two 4-GPU Qwen2.5-7B jobs need about
    # 69 GiB a GPU together, so they pair on 80 GiB GPUs but not on 40 GiB ones, whether
    # they arrive in the same round (no pool yet: the partition's GPU memory) or one
    # finds the other's pool open
    waiting = [job(1, gpus=4), job(2, gpus=4)]

    def gang(mem: int, pools: Sequence[PoolSnapshot] = (),
             jobs: Sequence[JobSnapshot] = waiting) -> dict[int, Placement]:
        snap = ClusterSnapshot(0.0, tuple(pools), tuple(jobs), {"pools": 64}, SiteLimits(),
                               gpu_mem_bytes={"pools": mem})
        return {p.job_id: p for p in registry.load("pairing", "gang").place(snap)}

    assert shared(gang(80 * GiB), 1, 2)
    assert not shared(gang(40 * GiB), 1, 2)
    pool = PoolSnapshot(7, 4, (job(1, gpus=4),), gpu_mem_bytes=40 * GiB)
    assert gang(40 * GiB, [pool], [job(2, gpus=4)])[2].action is Action.OPEN
