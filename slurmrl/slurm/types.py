"""Value types of the Slurm backend: what we ask Slurm for and what it tells us.

Every backend (command line, pyslurm) returns these same values, whatever the Slurm
version and output shape underneath. Times are UTC epoch seconds (float), time limits are
minutes (None = unlimited), memory is MiB.

Known limits: array jobs and heterogeneous jobs are reported per record as Slurm lists
them; slurmrl submits neither.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum


class SlurmError(RuntimeError):
    """A Slurm command failed. Carries the argument list, exit status and stderr."""

    def __init__(
        self, message: str, *, argv: Sequence[str] = (), returncode: int | None = None,
        stderr: str = "",
    ) -> None:
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stderr = stderr.strip()
        detail = message
        if self.argv:
            detail += f" [command: {' '.join(self.argv)}]"
        if returncode is not None:
            detail += f" [exit {returncode}]"
        if self.stderr:
            detail += f" [stderr: {self.stderr}]"
        super().__init__(detail)


class SlurmTimeout(SlurmError):
    """A Slurm command did not answer in time (slurmctld down or overloaded)."""


class SlurmParseError(SlurmError):
    """Slurm answered, but in a shape this module does not understand."""


class SlurmJobState(StrEnum):
    """Slurm's job (and step) state names, as squeue/scontrol print them."""

    PENDING = "PENDING"  #: queued, waiting for resources or dependencies
    CONFIGURING = "CONFIGURING"  #: allocated, nodes booting/configuring
    RUNNING = "RUNNING"  #: running
    SUSPENDED = "SUSPENDED"  #: running, suspended (scontrol suspend)
    COMPLETING = "COMPLETING"  #: ended; epilog or step cleanup still running
    STOPPED = "STOPPED"  #: SIGSTOPped, resources kept
    RESIZING = "RESIZING"  #: changing size
    REQUEUED = "REQUEUED"  #: being requeued
    SPECIAL_EXIT = "SPECIAL_EXIT"  #: requeued in held state after a special exit
    #: back in the queue, held (these flag names replace the base state in 22.05's
    #: string form, as Slurm's job_state_string() prints them)
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUE_FED = "REQUEUE_FED"  #: requeued by a federation
    RESV_DEL_HOLD = "RESV_DEL_HOLD"  #: held: its reservation was deleted
    COMPLETED = "COMPLETED"  #: terminal: all processes exited 0
    CANCELLED = "CANCELLED"  #: terminal: scancel or admin
    FAILED = "FAILED"  #: terminal: non-zero exit or launch failure
    TIMEOUT = "TIMEOUT"  #: terminal: time limit reached
    NODE_FAIL = "NODE_FAIL"  #: terminal: a node failed
    PREEMPTED = "PREEMPTED"  #: terminal: preempted
    BOOT_FAIL = "BOOT_FAIL"  #: terminal: node boot failed
    DEADLINE = "DEADLINE"  #: terminal: --deadline reached
    OUT_OF_MEMORY = "OUT_OF_MEMORY"  #: terminal: OOM
    UNKNOWN = "UNKNOWN"  #: a name this slurmrl does not know (newer Slurm); not terminal

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL

    @classmethod
    def parse(cls, value: object) -> SlurmJobState:
        """Slurm's state, from a string (22.05, scontrol) or a list of names (23.02+).

        In the list form the base state comes with flags; COMPLETING and CONFIGURING
        flags win over the base state, as Slurm's own `job_state_string()` does.
        """
        upper = _state_names(value)
        for flag in ("COMPLETING", "CONFIGURING"):
            if flag in upper:
                return cls(flag)
        return _base_state(upper) or cls.UNKNOWN

    @classmethod
    def ended_as(cls, value: object) -> SlurmJobState | None:
        """The terminal state a COMPLETING job ended in, where Slurm lists it beside the
        flag (23.02+: ["CANCELLED", "COMPLETING"]); None otherwise, 22.05's bare
        "COMPLETING" included."""
        upper = _state_names(value)
        base = _base_state(upper) if "COMPLETING" in upper else None
        return base if base is not None and base.terminal else None

    @property
    def queued(self) -> bool:
        """In (or back in) the queue: not running, not ended. A job seen running before
        that is in one of these was requeued (node failure, preemption, scontrol)."""
        return self in _QUEUED


def _state_names(value: object) -> list[str]:
    """Slurm's state as upper-case names, from a string or a list of strings."""
    if isinstance(value, str):
        names = [value]
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        names = [str(v) for v in value]
    else:
        raise SlurmParseError(f"job state must be a string or list of strings, got {value!r}")
    return [n.strip().upper() for n in names if n.strip()]


def _base_state(upper: list[str]) -> SlurmJobState | None:
    """The first known state name but the COMPLETING/CONFIGURING flags."""
    for n in upper:
        base = n.split()[0]  # scontrol may print e.g. "CANCELLED by 0"
        if base in SlurmJobState.__members__ and base not in ("COMPLETING", "CONFIGURING"):
            return SlurmJobState(base)
    return None


_TERMINAL = frozenset(
    {
        SlurmJobState.COMPLETED, SlurmJobState.CANCELLED, SlurmJobState.FAILED,
        SlurmJobState.TIMEOUT, SlurmJobState.NODE_FAIL, SlurmJobState.PREEMPTED,
        SlurmJobState.BOOT_FAIL, SlurmJobState.DEADLINE, SlurmJobState.OUT_OF_MEMORY,
    }
)

_QUEUED = frozenset(
    {
        SlurmJobState.PENDING, SlurmJobState.CONFIGURING, SlurmJobState.REQUEUED,
        SlurmJobState.SPECIAL_EXIT, SlurmJobState.REQUEUE_HOLD, SlurmJobState.REQUEUE_FED,
        SlurmJobState.RESV_DEL_HOLD,
    }
)
#: the terminal state a bare COMPLETING job (22.05) ended in, by Slurm's reason for it
_ENDED_FOR = {"TimeLimit": SlurmJobState.TIMEOUT, "NodeDown": SlurmJobState.NODE_FAIL}


@dataclass(frozen=True)
class BatchSpec:
    """A batch job to submit. Exactly one of `script` (text) or `command` (argv).

    `command` is turned into a script that `exec`s the argument list with POSIX quoting,
    so no argument is ever interpreted by a shell. `extra_args` are passed to sbatch
    verbatim as separate arguments (e.g. `("--rl-gpus=4", "--hold")`).
    """

    script: str | None = None
    command: tuple[str, ...] | None = None
    partition: str | None = None
    name: str | None = None
    gpus: int | None = None  #: --gres=gpu:N
    gpu_type: str | None = None  #: with `gpus`: --gres=gpu:TYPE:N
    cpus: int | None = None  #: --cpus-per-task
    mem_mb: int | None = None  #: --mem (MiB); 0 = all of the node's memory
    time_limit_min: int | None = None  #: --time in minutes; None = partition default
    uid: int | str | None = None  #: --uid (root only)
    gid: int | str | None = None  #: --gid (root only)
    comment: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)  #: added to the job's environment
    output: str | None = None  #: --output path (Slurm patterns like %j allowed)
    error: str | None = None  #: --error path
    workdir: str | None = None  #: --chdir
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.script is None) == (self.command is None):
            raise ValueError("BatchSpec needs exactly one of script= or command=")
        if self.command is not None and not self.command:
            raise ValueError("BatchSpec.command must not be empty")
        for name in ("gpus", "cpus", "mem_mb", "time_limit_min"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 0):
                raise ValueError(f"BatchSpec.{name} must be a non-negative int, got {v!r}")
        for k in self.env:
            if not k or "=" in k or "\0" in k:
                raise ValueError(f"BatchSpec.env has an invalid variable name {k!r}")


@dataclass(frozen=True)
class JobInfo:
    """One Slurm job as squeue/scontrol report it."""

    job_id: int
    name: str
    user: str
    uid: int
    state: SlurmJobState
    reason: str = ""  #: Slurm's state reason ("None" mapped to "")
    partition: str = ""
    nodes: tuple[str, ...] = ()  #: expanded node names
    gpu_indices: tuple[int, ...] = ()  #: GPU indices allocated on the first GPU node
    gpu_indices_by_node: tuple[tuple[str, tuple[int, ...]], ...] = ()  #: only nodes with GPUs
    start_time: float | None = None  #: None while unknown
    end_time: float | None = None  #: real or expected end; None while unknown
    comment: str = ""
    batch_host: str = ""
    exit_code: int | None = None  #: return code of the batch script, when known
    exit_signal: int | None = None  #: signal that ended it, when one did
    time_limit_min: int | None = None  #: None = unlimited
    #: a COMPLETING job's terminal state where Slurm lists it (`SlurmJobState.ended_as`)
    ended_as: SlurmJobState | None = None

    @property
    def end_state(self) -> SlurmJobState | None:
        """The terminal state the job ended in: its state; for a COMPLETING job the one
        Slurm lists beside the flag, else the one its reason names (22.05 prints a bare
        "COMPLETING": Reason=TimeLimit, NodeDown); None while it runs or is queued, or
        where Slurm does not say."""
        if self.state.terminal:
            return self.state
        if self.state is not SlurmJobState.COMPLETING:
            return None
        return self.ended_as or _ENDED_FOR.get(self.reason)


@dataclass(frozen=True)
class NodeInfo:
    """One Slurm node."""

    name: str
    state: str  #: Slurm's state, flags joined with "+" (e.g. "IDLE", "MIXED+DRAIN")
    gpus: int  #: GPUs configured through GRES
    cpus: int
    memory_mb: int
    partitions: tuple[str, ...] = ()
    #: NodeAddr: where Slurm itself reaches the node's slurmd ("" where not reported)
    address: str = ""
    #: its GPUs by GRES type, (type, count) pairs ("" for GPUs of no type): what a job's
    #: `--gres=gpu:TYPE:N` may take there (`gpu_types_from_gres`)
    gpu_types: tuple[tuple[str, int], ...] = ()

    def gpus_of(self, gpu_type: str | None) -> int:
        """GPUs of `gpu_type` it has (None: any, all of them)."""
        if gpu_type is None:
            return self.gpus
        return sum(n for t, n in self.gpu_types if t == gpu_type)


@dataclass(frozen=True)
class StepInfo:
    """One step of a job, as `scontrol show step` reports it."""

    job_id: int
    step: str  #: "0", "1", ... or "batch" / "extern" / "interactive"
    name: str = ""
    state: SlurmJobState = SlurmJobState.RUNNING
    nodes: tuple[str, ...] = ()
    srun_host: str = ""
    srun_pid: int | None = None  #: pid of the srun that launched it (matches StepHandle.pid)
    start_time: float | None = None

    @property
    def number(self) -> int | None:
        """The numeric step id, or None for batch/extern/interactive steps."""
        return int(self.step) if self.step.isdigit() else None
