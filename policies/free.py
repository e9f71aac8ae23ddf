"""The free GPUs one pairing round hands out to the pools it opens.

Slurm allocates a pool all of its GPUs on one node (`--gres=gpu:N`, one task), so a
round may open a pool of N only where some node still has N free: with 4 free on each
of two nodes, the partition has 8 free but no pool of 8 starts. Where the snapshot says
each node's free GPUs (`ClusterSnapshot.free_node_gpus`: the controller, from Slurm),
each pool takes its GPUs from one node, best fit; where it does not (the simulator,
which has no nodes beyond a pool's bound), the partition's total alone counts, as a
scheduler of one large node would.
"""

from __future__ import annotations

from policies.base import ClusterSnapshot


class FreeGpus:
    """A round's free GPUs per partition (and per node, where known)."""

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self._total = dict(snapshot.free_gpus)
        self._nodes = {p: list(v) for p, v in snapshot.free_node_gpus.items()}

    def fits(self, partition: str, gpus: int) -> bool:
        """Whether a pool of `gpus` GPUs could open in `partition` now."""
        if self._total.get(partition, 0) < gpus:
            return False
        nodes = self._nodes.get(partition)
        return nodes is None or any(f >= gpus for f in nodes)

    def take(self, partition: str, gpus: int) -> bool:
        """Take `gpus` GPUs for a pool (or a floating pool's window) opened this round,
        from the node with the fewest free that has them (best fit: larger holes stay
        for larger pools). False, taking nothing, where they do not fit."""
        if not self.fits(partition, gpus):
            return False
        self._total[partition] -= gpus
        nodes = self._nodes.get(partition)
        if nodes is not None:
            at = min((i for i, f in enumerate(nodes) if f >= gpus), key=nodes.__getitem__)
            nodes[at] -= gpus
        return True

    def why_not(self, partition: str, gpus: int) -> str:
        """Why a pool of `gpus` GPUs does not fit (`fits` is False): the reason its job
        waits with."""
        nodes = self._nodes.get(partition)
        if nodes is None or self._total.get(partition, 0) < gpus:
            return "no free GPUs"
        return (f"no node of partition {partition!r} has {gpus} GPUs free (at most "
                f"{max(nodes, default=0)} on one)")
