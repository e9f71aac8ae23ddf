"""The free GPUs one pairing round hands out to the pools it opens.

Slurm allocates a pool all of its GPUs on one node (`--gres=gpu[:TYPE]:N`, one task),
so a round may open a pool of N only where some node still has N free, of the job's GPU
type where it names one (`--rl-gpus=TYPE:N`): with 4 free on each of two nodes, the
partition has 8 free but no pool of 8 starts. Where the snapshot says each node's free
GPUs (`ClusterSnapshot.free_node_gpus`: the controller, from Slurm), each pool takes
its GPUs from one node, best fit; where it does not (the simulator, which has no nodes
beyond a pool's bound, nor GPU types), the partition's total alone counts, as a
scheduler of one large node would.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import ClusterSnapshot, JobSnapshot


@dataclass
class _Node:
    free: int
    types: dict[str, int]  #: GPUs of each type not taken this round
    size: dict[str, int]  #: GPUs of each type in all
    name: str = ""
    held: bool = False  #: held for an older job that waits for room (`wait`)

    def free_of(self, gpu_type: str | None) -> int:
        return self.free if gpu_type is None else min(self.free, self.types.get(gpu_type, 0))

    def size_of(self, gpu_type: str | None) -> int:
        return sum(self.size.values()) if gpu_type is None else self.size.get(gpu_type, 0)


class FreeGpus:
    """A round's free GPUs per partition (and per node, where known)."""

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self._total = dict(snapshot.free_gpus)
        self._nodes = {p: [_Node(n.free, dict(n.types), dict(n.types), n.name) for n in nodes]
                       for p, nodes in snapshot.free_node_gpus.items()}
        #: partition -> (the job a node is held for, that node's name)
        self._holding: dict[str, tuple[int, str]] = {}

    def _candidates(self, job: JobSnapshot, gpus: int) -> list[_Node] | None:
        """The nodes a pool of `gpus` GPUs of the job's type could open on; None where
        the snapshot gives no nodes."""
        nodes = self._nodes.get(job.partition)
        if nodes is None:
            return None
        return [n for n in nodes if not n.held and n.free_of(job.gpu_type) >= gpus]

    def fits(self, job: JobSnapshot, gpus: int) -> bool:
        """Whether a pool of `gpus` GPUs (of the job's type) could open for `job` now."""
        if self._total.get(job.partition, 0) < gpus:
            return False
        fit = self._candidates(job, gpus)
        return fit is None or bool(fit)

    def take(self, job: JobSnapshot, gpus: int) -> bool:
        """Take `gpus` GPUs for a pool (or a floating pool's window) opened this round for
        `job`, from the node with the fewest free that has them (best fit: larger holes
        stay for larger pools). False, taking nothing, where they do not fit."""
        if not self.fits(job, gpus):
            return False
        self._total[job.partition] -= gpus
        fit = self._candidates(job, gpus)
        if fit:
            node = min(fit, key=lambda n: n.free_of(job.gpu_type))
            node.free -= gpus
            if job.gpu_type is not None:
                node.types[job.gpu_type] -= gpus
        return True

    def wait(self, job: JobSnapshot, gpus: int) -> str:
        """`job` waits, its pool of `gpus` GPUs not fitting (`fits` is False): the reason
        it waits with. The first job of a partition that waits for room in a round (the
        oldest, where the policy places jobs oldest first) holds the node nearest to
        having room for it, one with `gpus` GPUs of its type in all and the most free:
        no younger job's pool takes GPUs there this round, so younger, smaller jobs do
        not keep filling the node it waits for (as Slurm's backfill holds a node for
        its highest-priority pending job). Other Slurm jobs still may: its pool is not
        in Slurm's queue."""
        why = self.why_not(job, gpus)
        nodes = self._nodes.get(job.partition)
        if nodes is not None and job.partition not in self._holding:
            could = [n for n in nodes if not n.held and n.size_of(job.gpu_type) >= gpus]
            if could:
                node = max(could, key=lambda n: n.free_of(job.gpu_type))
                node.held = True
                self._holding[job.partition] = (job.job_id, node.name)
        return why

    def held(self, partition: str) -> tuple[int, str] | None:
        """(the job, the node's name) of the node held in `partition` this round, if any:
        whoever opens the round's pools keeps the younger jobs' off it (the controller
        passes Slurm `--exclude`)."""
        return self._holding.get(partition)

    def why_not(self, job: JobSnapshot, gpus: int) -> str:
        """Why a pool of `gpus` GPUs does not fit (`fits` is False)."""
        nodes = self._nodes.get(job.partition)
        if nodes is None or self._total.get(job.partition, 0) < gpus:
            return "no free GPUs"
        most = max((n.free_of(job.gpu_type) for n in nodes if not n.held), default=0)
        of = "" if job.gpu_type is None else f" of type {job.gpu_type!r}"
        return (f"no node of partition {job.partition!r} has {gpus} GPUs{of} free (at most "
                f"{most} on one)")
