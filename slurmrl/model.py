"""The nouns of slurmrl as value types, shared by every package.

See docs/architecture.md for the vocabulary: RL job, driver, service, pool, group, lease,
layout, phase, profile, residency, ledger. Value types are frozen dataclasses; state enums
say which members are terminal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Phase(StrEnum):
    """What an RL job is doing. GPU phases need a lease; gaps do not."""

    ROLLOUT = "rollout"  #: generation on the rollout service (GPU)
    TRAIN = "train"  #: log-prob + update on the trainer service (GPU)
    SYNC = "sync"  #: trainer -> rollout weight transfer (GPU)
    REWARD = "reward"  #: reward verification / tool calls on CPU (gap)
    IDLE = "idle"  #: anything else the driver does off GPU (gap)

    #: whether the phase needs a lease (a plain attribute: the simulator reads it
    #: millions of times, and a property looking members up on the class cost ~15x)
    needs_gpu: bool

    def __init__(self, value: str) -> None:
        self.needs_gpu = value in ("rollout", "train", "sync")


GPU_PHASES: tuple[Phase, ...] = (Phase.ROLLOUT, Phase.TRAIN, Phase.SYNC)


class Layout(StrEnum):
    """How a job uses its GPUs."""

    COLOCATED = "colocated"  #: rollout and trainer share one GPU set
    DISAGGREGATED = "disaggregated"  #: a rollout set and a trainer set


class Mux(StrEnum):
    """The user's `--rl-mux` choice."""

    AUTO = "auto"  #: share a pool when the pairing policy finds a partner
    ON = "on"  #: prefer sharing (still bounded by max slowdown)
    OFF = "off"  #: a dedicated pool, same code


class Residency(StrEnum):
    """Memory state of a service."""

    ACTIVE = "active"  #: on GPU, may run
    PARKED = "parked"  #: weights in pinned host memory, KV freed
    DROPPED = "dropped"  #: weights freed; refilled by the next weight sync
    STOPPED = "stopped"  #: terminal: the process is gone


class JobState(StrEnum):
    """Lifecycle of an RL job in the controller."""

    PENDING = "PD"  #: registered, waiting for placement in a pool
    RUNNING = "R"  #: placed; services up
    COMPLETED = "CD"  #: terminal: driver deregistered normally
    FAILED = "F"  #: terminal: driver or services failed
    CANCELLED = "CA"  #: terminal: Slurm job cancelled or pool lost

    @property
    def terminal(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)


class LeaseState(StrEnum):
    """Lifecycle of a lease (and of the phase request that becomes one)."""

    WAITING = "waiting"  #: queued on its GPU set
    HELD = "held"  #: granted; GPUs belong to it until its deadline
    RELEASED = "released"  #: terminal: the driver released it
    REVOKED = "revoked"  #: terminal: deadline lapsed, job ended or pool lost
    CANCELLED = "cancelled"  #: terminal: withdrawn before grant

    @property
    def terminal(self) -> bool:
        return self in (LeaseState.RELEASED, LeaseState.REVOKED, LeaseState.CANCELLED)


@dataclass(frozen=True)
class PhasePrior:
    """`--rl-profile`: the user's prior on phase shares of one step (sum to 1)."""

    shares: tuple[tuple[Phase, float], ...]
    step_s: float | None = None  #: typical step period in seconds, if known

    def share(self, phase: Phase) -> float:
        return dict(self.shares).get(phase, 0.0)


@dataclass(frozen=True)
class RlRequest:
    """What a job asked for through its `#SBATCH --rl-*` directives."""

    gpus: int
    model: str = "tiny"
    mem_bytes: int | None = None  #: GPU memory per GPU its resident model set needs
    mux: Mux = Mux.AUTO
    group: str | None = None
    max_slowdown: float | None = None
    profile: PhasePrior | None = None
    layout: Layout = Layout.COLOCATED
    rollout_gpus: int | None = None  #: disaggregated only: size of the rollout set
    #: `--rl-steps`: training steps the job will run (None: not declared). Pairing uses it
    #: to project a running job's slowdown over its whole run (policies/complementarity.py)
    steps: int | None = None
    #: `--rl-gpus=TYPE:N`: the GPU type its pool's GPUs must be (Slurm's GRES type, as in
    #: `--gres=gpu:TYPE:N`); None: any
    gpu_type: str | None = None

    def gpu_sets(self) -> dict[str, tuple[int, ...]]:
        """Job-local GPU sets by name: `all` (colocated) or `rollout` + `trainer`."""
        if self.layout is Layout.COLOCATED:
            return {"all": tuple(range(self.gpus))}
        r = self.rollout_gpus or max(1, self.gpus // 2)
        return {"rollout": tuple(range(r)), "trainer": tuple(range(r, self.gpus))}

    def gpus_for(self, phase: Phase) -> tuple[int, ...]:
        """Job-local GPU indices a GPU phase runs on.

        Colocated: every phase on all GPUs. Disaggregated: rollout on the rollout set,
        train and sync on the trainer set. A disaggregated sync leases the trainer set
        only: the trainer exports its weights, the rollout service stages them in host
        memory if it is parked, and loads them when it is next activated (for its
        rollout lease), so a sync never waits for a partner that holds the rollout set.
        """
        sets = self.gpu_sets()
        if self.layout is Layout.COLOCATED:
            return tuple(range(self.gpus))
        return sets["rollout"] if phase is Phase.ROLLOUT else sets["trainer"]


@dataclass(frozen=True)
class Identity:
    """Who is calling, as MUNGE (never the caller) says."""

    uid: int
    gid: int
    user: str = field(default="")


def dedicated_gpu_s(gpus: int, registered_at: float, first_request_at: float | None,
                    end: float) -> float:
    """What a dedicated allocation of a job's `gpus` would have cost up to `end` (the
    ledger's counterfactual, in `slurmrl status` and `slurmrl report` alike): from its
    first phase request, not from its registration, since a driver registers as its CPU
    job starts, while its pool may still be pending in Slurm or waiting for a partner,
    and a dedicated allocation would cost nothing then. 0 before any request."""
    if first_request_at is None:
        return 0.0
    return gpus * max(0.0, end - max(first_request_at, registered_at))
