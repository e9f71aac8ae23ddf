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
from policies.base import Action, ClusterSnapshot, JobSnapshot, NodeFree, Placement, SiteLimits
from policies.free import FreeGpus
from slurmrl.model import Mux, RlRequest

POLICIES = ["complementary", "dedicated", "random", "greedy", "fifo-lock", "gang"]


def job(jid: int, gpus: int, mux: Mux = Mux.AUTO, gpu_type: str | None = None,
        ) -> JobSnapshot:
    return JobSnapshot(jid, f"u{jid}", RlRequest(gpus, "Qwen2.5-7B", mux=mux,
                                                 gpu_type=gpu_type), None,
                       float(jid), gpu_type=gpu_type)


def snap(waiting: Sequence[JobSnapshot], nodes: tuple[int | NodeFree, ...] | None,
         total: int | None = None) -> ClusterSnapshot:
    given = () if nodes is None else tuple(
        n if isinstance(n, NodeFree) else NodeFree(n) for n in nodes)
    free = sum(n.free for n in given) if total is None else total
    return ClusterSnapshot(0.0, (), tuple(waiting), {"pools": free}, SiteLimits(),
                           free_node_gpus={} if nodes is None else {"pools": given})


def place(name: str, s: ClusterSnapshot) -> dict[int, Placement]:
    return {p.job_id: p for p in registry.load("pairing", name).place(s)}


def test_a_pool_takes_its_gpus_from_the_node_that_fits_it_best() -> None:
    j = job(1, 1)
    free = FreeGpus(snap([], (4, 2, 8)))
    assert free.fits(j, 8) and not free.fits(j, 9)
    assert free.take(j, 2)  # from the node of 2, not a larger hole
    assert free.fits(j, 8) and free.take(j, 8)
    # left: 4 on the first node, none on the others
    assert not free.fits(j, 8) and free.fits(j, 4)
    assert free.why_not(j, 8) == "no free GPUs"  # not 8 in the whole partition
    free = FreeGpus(snap([], (4, 2, 8)))
    assert free.take(j, 8)  # 6 free are left, at most 4 on one node
    assert free.why_not(j, 5) == ("no node of partition 'pools' has 5 GPUs free "
                                  "(at most 4 on one)")
    assert not free.take(j, 5)  # a refused take takes nothing
    assert free.take(j, 4) and free.take(j, 2) and not free.fits(j, 1)
    # without nodes (the simulator): the partition's total alone
    free = FreeGpus(snap([], None, total=8))
    assert free.take(j, 5) and free.fits(j, 3) and not free.fits(j, 4)
    assert free.why_not(j, 4) == "no free GPUs"
    other = JobSnapshot(2, "u2", RlRequest(1, "tiny"), None, 2.0, partition="other")
    assert not FreeGpus(snap([], None, total=8)).fits(other, 1)


def test_a_typed_pool_takes_gpus_of_its_type_only() -> None:
    # n1: 4 a100 free; n2: 8 h100, 6 free; n3: 2 a100 and 2 h100, 3 free
    nodes = (NodeFree(4, (("a100", 4),)), NodeFree(6, (("h100", 8),)),
             NodeFree(3, (("a100", 2), ("h100", 2))))
    a100, h100, any_ = job(1, 1, gpu_type="a100"), job(2, 1, gpu_type="h100"), job(3, 1)
    free = FreeGpus(snap([], nodes))
    assert free.fits(a100, 4) and not free.fits(a100, 5) and free.fits(h100, 6)
    assert not free.fits(job(4, 1, gpu_type="v100"), 1)
    assert free.why_not(a100, 5) == ("no node of partition 'pools' has 5 GPUs of type "
                                     "'a100' free (at most 4 on one)")
    assert free.take(a100, 2)  # best fit: the mixed node's 2 a100, not n1's 4
    assert free.fits(a100, 4)  # n1's 4 stay whole
    assert free.take(a100, 4) and not free.fits(a100, 1)  # n1's, then none left
    assert free.fits(h100, 1)  # the mixed node keeps 1 free GPU, an h100
    assert free.fits(any_, 6) and free.take(any_, 6) and not free.fits(h100, 2)


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


def test_the_oldest_job_waiting_for_room_holds_the_node_nearest_to_it() -> None:
    # n1: 6 of its 8 GPUs free, n2: 4 of 8, n3: 7 of 7 (too small for 8 ever)
    nodes = (NodeFree(6, (("", 8),)), NodeFree(4, (("", 8),)), NodeFree(7, (("", 7),)))
    free = FreeGpus(snap([], nodes))
    old, young = job(1, 8), job(2, 6)
    assert not free.fits(old, 8)
    assert free.wait(old, 8) == ("no node of partition 'pools' has 8 GPUs free (at most "
                                 "7 on one)")
    # n1 is held for it (n3, with more free, can never hold 8): a younger job of 6 may
    # take n3's but not n1's; one of 4 takes n2's
    assert free.take(young, 6) and not free.fits(job(3, 6), 6)
    assert free.why_not(job(3, 6), 6) == ("no node of partition 'pools' has 6 GPUs free "
                                          "(at most 4 on one)")
    assert free.take(job(4, 4), 4)  # n2's; n3 has 1 left, n1's 6 are held
    assert free.fits(job(5, 1), 1) and not free.fits(job(5, 2), 2)
    # one node held a partition a round: a second job waiting holds none
    free = FreeGpus(snap([], nodes))
    free.wait(old, 8)
    free.wait(job(6, 8), 8)
    assert free.take(job(7, 4), 4) and free.take(job(8, 7), 7)


@pytest.mark.parametrize("name", POLICIES)
def test_younger_jobs_leave_the_node_an_older_one_waits_for(name: str) -> None:
    # the oldest job needs 8 GPUs: n1 has 6 of its 8 free, n2 4 of its 8. Without the
    # hold, the 6-GPU job would fill n1 and the 8-GPU one wait on for it to drain
    nodes = (NodeFree(6, (("", 8),)), NodeFree(4, (("", 8),)))
    waiting = [job(1, 8, Mux.OFF), job(2, 6, Mux.OFF), job(3, 4, Mux.OFF)]
    out = place(name, snap(waiting, nodes))
    assert [out[j].action for j in (1, 2, 3)] == [Action.WAIT, Action.WAIT, Action.DEDICATED]
    assert out[2].reason == ("no node of partition 'pools' has 6 GPUs free (at most 4 on "
                             "one)")
