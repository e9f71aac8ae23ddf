"""Read-only looks at a site's Slurm setup, for `slurmrl doctor`.

Added beside the backend (not into the `SlurmBackend` protocol): these are installation
checks, not operations the controller performs. Each runs one Slurm command through
`CommandBackend.run` (argument lists, a timeout) and raises `SlurmError`/`SlurmTimeout`
as the backend does.

Known limits: `sbatch --help` shows the SPANK options of the node it runs on, so it
proves the plugin loads on *this* host only; check one login and one compute node.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurmrl.slurm import parse
from slurmrl.slurm.command import CommandBackend
from slurmrl.slurm.types import SlurmError


@dataclass(frozen=True)
class PartitionInfo:
    """The parts of `scontrol show partition` slurmrl cares about."""

    name: str
    state: str  #: UP, DOWN, DRAIN, INACTIVE
    nodes: str  #: Slurm hostlist expression
    allow_groups: str  #: "ALL" or a comma-separated group list
    allow_accounts: str
    root_only: bool
    max_time: str
    default_time: str = ""  #: DefaultTime ("NONE": MaxTime is a job's default)


def sbatch_help(backend: CommandBackend) -> str:
    """`sbatch --help` as this host's sbatch prints it (SPANK options included)."""
    return backend.run(["sbatch", "--help"]).stdout


def partition(backend: CommandBackend, name: str) -> PartitionInfo | None:
    """One partition, or None if Slurm has no partition of that name."""
    cp = backend.run(["scontrol", "-o", "show", "partition", name], check=False)
    if cp.returncode != 0:
        said = (cp.stdout + cp.stderr).lower()  # 22.05 prints "not found" on stdout
        if "invalid partition" in said or "not found" in said:
            return None
        raise SlurmError("command failed", argv=["scontrol", "-o", "show", "partition", name],
                         returncode=cp.returncode, stderr=cp.stderr)
    for line in parse.records(cp.stdout):
        kv = dict(parse.parse_kv_line(line))
        if kv.get("PartitionName") == name:
            return PartitionInfo(
                name=name, state=kv.get("State", ""), nodes=kv.get("Nodes", ""),
                allow_groups=kv.get("AllowGroups", "ALL"),
                allow_accounts=kv.get("AllowAccounts", "ALL"),
                root_only=kv.get("RootOnly", "NO") == "YES", max_time=kv.get("MaxTime", ""),
                default_time=kv.get("DefaultTime", ""),
            )
    return None
