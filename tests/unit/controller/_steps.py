"""A fake of the launcher's Slurm-facing housekeeping, for the pool manager's tests: the
service steps Slurm lists in each allocation (by the service id their name carries)
and the kills of those no live record owns, as `ServiceLauncher.kill_strays` does them
on a real Slurm (tests/integration/test_pools.py)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path


class FakeSteps:
    def __init__(self) -> None:
        #: allocation -> the service ids whose steps Slurm lists there
        self.steps: dict[int, set[int]] = {}
        self.killed: list[tuple[int, int]] = []  #: (allocation, service id) of each kill
        self.pruned: list[tuple[list[int], float]] = []  #: (allocations held, age) asked

    def kill_strays(self, allocations: list[int],
                    live: Callable[[int], bool]) -> list[tuple[int, str, int]]:
        out = []
        for alloc in allocations:
            for sid in sorted(self.steps.get(alloc, ())):
                if not live(sid):
                    self.steps[alloc].discard(sid)
                    self.killed.append((alloc, sid))
                    out.append((alloc, "0", sid))
        return out

    def prune(self, held: Collection[int], older_than_s: float) -> list[Path]:
        self.pruned.append((sorted(held), older_than_s))  # test_services.py prunes files
        return []
