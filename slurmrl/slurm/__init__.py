"""slurmrl.slurm — the only code in slurmrl that talks to Slurm.

Call `default_backend()` and use the `SlurmBackend` protocol: submit batch jobs, query
jobs/nodes/steps, launch long-lived steps into an allocation, cancel and signal. Values
come back as frozen dataclasses (`JobInfo`, `NodeInfo`, `StepInfo`) whatever the Slurm
version (22.05 through 25.11) and backend. Failures raise `SlurmError` (with the
command and its stderr); `SlurmTimeout` when Slurm does not answer in time.
"""

from slurmrl.slurm.backend import SlurmBackend, StepHandle
from slurmrl.slurm.command import CommandBackend
from slurmrl.slurm.factory import default_backend, pyslurm_status
from slurmrl.slurm.types import (
    BatchSpec,
    JobInfo,
    NodeInfo,
    SlurmError,
    SlurmJobState,
    SlurmParseError,
    SlurmTimeout,
    StepInfo,
)

__all__ = [
    "BatchSpec",
    "CommandBackend",
    "JobInfo",
    "NodeInfo",
    "SlurmBackend",
    "SlurmError",
    "SlurmJobState",
    "SlurmParseError",
    "SlurmTimeout",
    "StepHandle",
    "StepInfo",
    "default_backend",
    "pyslurm_status",
]
