"""slurmrl: multiplex the GPUs of RL post-training jobs on a Slurm cluster.

A driver (the user's batch script) imports this package and calls :func:`connect`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from slurmrl.client import connect as connect


def __getattr__(name: str) -> Any:
    # Lazy, so that `import slurmrl` (the CLI, services) does not load the client.
    if name == "connect":
        from slurmrl.client import connect

        return connect
    raise AttributeError(f"module 'slurmrl' has no attribute {name!r}")
