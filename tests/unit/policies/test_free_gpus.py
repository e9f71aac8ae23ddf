"""A pool takes all of its GPUs from one node: every pairing policy opens only the pools
some node has room for, where the snapshot says each node's free GPUs (the controller
does, from Slurm), and counts the partition's total alone where it does not (the
simulator)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import registry
from policies.base import Action, ClusterSnapshot, JobSnapshot, Placement, SiteLimits
from policies.free import FreeGpus
from slurmrl.model import Mux, RlRequest

POLICIES = ["complementary", "dedicated", "random", "greedy", "fifo-lock", "gang"]


def job(jid: int, gpus: int, mux: Mux = Mux.AUTO) -> JobSnapshot:
    return JobSnapshot(jid, f"u{jid}", RlRequest(gpus, "Qwen2.5-7B", mux=mux), None,
                       float(jid))


def snap(waiting: Sequence[JobSnapshot], nodes: tuple[int, ...] | None,
         total: int | None = None) -> ClusterSnapshot:
    free = sum(nodes) if total is None and nodes is not None else total or 0
    return ClusterSnapshot(0.0, (), tuple(waiting), {"pools": free}, SiteLimits(),
                           free_node_gpus={} if nodes is None else {"pools": nodes})


def place(name: str, s: ClusterSnapshot) -> dict[int, Placement]:
    return {p.job_id: p for p in registry.load("pairing", name).place(s)}


def test_a_pool_takes_its_gpus_from_the_node_that_fits_it_best() -> None:
    free = FreeGpus(snap([], (4, 2, 8)))
    assert free.fits("pools", 8) and not free.fits("pools", 9)
    assert free.take("pools", 2)  # from the node of 2, not a larger hole
    assert free.fits("pools", 8) and free.take("pools", 8)
    # left: 4 on the first node, none on the others
    assert not free.fits("pools", 8) and free.fits("pools", 4)
    assert free.why_not("pools", 8) == "no free GPUs"  # not 8 in the whole partition
    free = FreeGpus(snap([], (4, 2, 8)))
    assert free.take("pools", 8)  # 6 free are left, at most 4 on one node
    assert free.why_not("pools", 5) == ("no node of partition 'pools' has 5 GPUs free "
                                        "(at most 4 on one)")
    assert not free.take("pools", 5)  # a refused take takes nothing
    assert free.take("pools", 4) and free.take("pools", 2) and not free.fits("pools", 1)
    # without nodes (the simulator): the partition's total alone
    free = FreeGpus(snap([], None, total=8))
    assert free.take("pools", 5) and free.fits("pools", 3) and not free.fits("pools", 4)
    assert free.why_not("pools", 4) == "no free GPUs"
    assert not FreeGpus(snap([], None, total=8)).fits("other", 1)


@pytest.mark.parametrize("name", POLICIES)
def test_a_job_no_node_has_room_for_waits_and_a_younger_one_that_fits_opens(
        name: str) -> None:
    # 8 GPUs free in the partition, 4 on each of two nodes: the older 8-GPU job cannot
    # start (Slurm would keep its pool pending), the younger 4-GPU one can
    waiting = [job(1, 8), job(2, 4, mux=Mux.OFF)]
    out = place(name, snap(waiting, (4, 4)))
    assert out[1].action is Action.WAIT
    assert out[1].reason == ("no node of partition 'pools' has 8 GPUs free (at most 4 "
                             "on one)")
    assert out[2].action is Action.DEDICATED and out[2].gpus == 4
    # without nodes in the snapshot (the simulator's), the 8 free GPUs hold the older
    out = place(name, snap(waiting, None, total=8))
    assert out[1].action in (Action.OPEN, Action.DEDICATED) and out[2].action is Action.WAIT
    assert out[2].reason == "no free GPUs"


def _packs(sizes: list[int], nodes: tuple[int, ...]) -> bool:
    """Whether pools of `sizes` GPUs fit on `nodes`, each pool on one node."""
    if not sizes:
        return True
    first, rest = sizes[0], sizes[1:]
    left = list(nodes)
    for i in range(len(left)):
        if left[i] >= first:
            left[i] -= first
            if _packs(rest, tuple(left)):
                return True
            left[i] += first
    return False


@settings(max_examples=60, deadline=None)
@given(nodes=st.lists(st.integers(0, 8), min_size=1, max_size=4),
       sizes=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=6),
       offs=st.lists(st.booleans(), min_size=6, max_size=6),
       name=st.sampled_from(POLICIES))
def test_the_pools_a_round_opens_fit_the_nodes_free_gpus(
        nodes: list[int], sizes: list[int], offs: list[bool], name: str) -> None:
    waiting = [job(i + 1, g, Mux.OFF if off else Mux.AUTO)
               for i, (g, off) in enumerate(zip(sizes, offs, strict=False))]
    out = place(name, snap(waiting, tuple(nodes)))
    opened: dict[object, int] = {}
    for k, p in enumerate(out.values()):
        if p.action is Action.DEDICATED:
            opened[("dedicated", k)] = p.gpus or 0
        elif p.action is Action.OPEN:  # members of one new pool share its id
            opened[p.pool_id] = max(opened.get(p.pool_id, 0), p.gpus or 0)
    assert _packs(sorted(opened.values(), reverse=True), tuple(nodes)), (nodes, out)
    # every job left waiting is told why
    assert all(p.reason for p in out.values() if p.action is Action.WAIT)
