"""The service backend protocol and the value types that cross it.

A *service* hosts one backend for one RL job and one role (`rollout` or `trainer`).
Every backend — `tiny` (CPU, tests and demo), `torch` (GPU trainer), `vllm` (GPU
rollout) — implements `ServiceBackend`; the HTTP server in `server.py` only ever talks
to this protocol. Backends are not thread-safe: the server serialises calls to them.

Park levels follow vLLM's sleep levels: level 1 keeps the weights in (pinned) host
memory (`Residency.PARKED`), level 2 discards them (`Residency.DROPPED`) and the next
weight import refills them. A trainer cannot drop: its optimizer state would be lost.
A DROPPED service holds no host copy of its weights (weights imported into it since are
held until its activation). A level-2 park of an already PARKED service either frees
its host copy and makes it DROPPED (`tiny`, `torch`), or, where the backend cannot
(`vllm`: a sleeping engine cannot give up its CPU copy of the weights without waking
first, and waking needs the GPU memory), changes nothing and it stays PARKED, as its
answer says. The residency planner counts a drop of a parked service as freeing host
memory only for backends of the first kind (`controller/residency.py`,
`DROPS_PARKED_BACKENDS`).

Hand-off (floating pools): one service may run as several copies, one per GPU window of
a pool, in separate processes on one node, one of them active. `hand_off(path)` writes
the active copy's whole state to a private node-local file and frees it here (PARKED,
`handed_off`); `take_over(path)` loads that file into another copy (ACTIVE). A
hand-off of a changed state numbers it one generation up (an unchanged one keeps its
own; a fresh copy's is 0) and never replaces a newer file; a copy
refuses to take over a file older than the state it holds. The file's format is
`handoff.py`'s. Backends that cannot (`vllm`) raise BackendError from both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, TypeGuard, runtime_checkable

from slurmrl.model import Residency


class Role(StrEnum):
    """What a service does for its RL job."""

    ROLLOUT = "rollout"  #: generates samples
    TRAINER = "trainer"  #: computes the policy update


class BackendError(Exception):
    """A call the backend refuses; the message says why (HTTP 400)."""


class NotReady(BackendError):
    """The backend's residency forbids the call right now (HTTP 409)."""


#: the largest sampling temperature: vLLM's SamplingParams refuses more (its own error)
MAX_TEMPERATURE = 2.0
#: the largest `GenerateParams.seed`, and every per-sequence seed is below it too
MAX_SEED = 2**63 - 1
#: the largest token id a call takes (what a signed 64-bit torch tensor holds); a
#: model's vocabulary bounds it further where the backend knows it
MAX_TOKEN_ID = 2**63 - 1


def is_token_ids(value: Any) -> TypeGuard[list[int]]:
    """A list of token ids: integers in 0..MAX_TOKEN_ID."""
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID
        for t in value)


def sequence_seed(seed: int, index: int) -> int:
    """The seed of the sequence at `index` of a batch sampled with `seed`: within signed
    64 bits (a torch.Generator or vLLM's per-request seed takes no more)."""
    return (seed * 1_000_003 + index) % (MAX_SEED + 1)


@dataclass(frozen=True)
class GenerateParams:
    """Sampling parameters of one `generate` call.

    `seed` makes sampling reproducible: the same prompts, parameters and weights give the
    same outputs, also across park/activate. Every backend takes seeds in 0..2**63-1
    (`MAX_SEED`: `time.time_ns()` fits), and derives each sequence's seed from it and the
    sequence's index within signed 64 bits (`sequence_seed`). `temperature` is in 0..2,
    the range vLLM's SamplingParams takes (0: greedy). `micro_batch` is how many prompts decode
    together; prompts are processed micro-batch after micro-batch, which is what makes
    the active-sequence count shrink through the long tail. `first_index` is the position
    of the call's first prompt in a larger batch split over rollout replicas: sampling
    depends on a prompt's position in the whole batch, so with `tiny` and `torch` the
    outputs do not depend on how the batch was split. A `vllm` engine's logits depend on
    what it batches together unless vLLM's batch-invariant kernels are on
    (`VLLM_BATCH_INVARIANT=1`, which a site may set: vLLM's beta, for recent NVIDIA
    GPUs; see vllm_backend.py), and that has not run here.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    seed: int = 0
    micro_batch: int = 8
    first_index: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.max_tokens <= 65536:
            raise BackendError(f"max_tokens must be in 1..65536, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise BackendError(f"temperature must be in 0..{MAX_TEMPERATURE:g}, got "
                               f"{self.temperature}")
        if not 0 <= self.seed <= MAX_SEED:
            raise BackendError(f"seed must be in 0..2**63-1, got {self.seed}")
        if self.micro_batch < 1:
            raise BackendError(f"micro_batch must be >= 1, got {self.micro_batch}")
        if not 0 <= self.first_index <= 2**31:
            raise BackendError(f"first_index must be in 0..2**31, got {self.first_index}")

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> GenerateParams:
        """Parse a JSON object; unknown keys and wrong types are errors that name the key."""
        known: dict[str, type | tuple[type, ...]] = {
            "max_tokens": int, "temperature": (int, float), "seed": int, "micro_batch": int,
            "first_index": int,
        }
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise BackendError(f"unknown generate param(s) {unknown}; valid: {sorted(known)}")
        for key, typ in known.items():
            if key in raw and (isinstance(raw[key], bool) or not isinstance(raw[key], typ)):
                raise BackendError(f"generate param {key!r} has the wrong type: {raw[key]!r}")
        kw: dict[str, Any] = dict(raw)
        if "temperature" in kw:
            try:
                kw["temperature"] = float(kw["temperature"])
            except OverflowError:  # an integer too large for a float
                raise BackendError(f"temperature must be in 0..{MAX_TEMPERATURE:g}, got "
                                   "an integer too large for a float") from None
        return cls(**kw)


#: the longest completion prefix a `generate` call continues
MAX_PREFIX_TOKENS = 65536


@dataclass(frozen=True)
class Continuation:
    """Where each prompt of a `generate` call stands in a larger rollout.

    `indices[k]`: prompt k's place in the whole batch (its sampling depends on it, not
    on the call it is in); `prefixes[k]`: the completion token ids it already has, which
    the call continues (`max_tokens` more at most; the sample returned holds the prefix
    and the new ids). A replicated rollout uses it to move unfinished sequences onto
    fewer replicas (slurmrl/client/replicas.py). Without it a call's prompts are at
    `first_index`, `first_index + 1`, ... and start empty.
    """

    indices: tuple[int, ...]
    prefixes: tuple[tuple[int, ...], ...]

    @classmethod
    def from_json(cls, raw: Any, n_prompts: int) -> Continuation:
        """Parse `{"indices": [...], "prefixes": [[...], ...]}`; each list has one entry
        per prompt. Errors name the key and the entry."""
        if not isinstance(raw, Mapping):
            raise BackendError("continuation must be an object with indices and prefixes")
        unknown = sorted(set(raw) - {"indices", "prefixes"})
        if unknown:
            raise BackendError(f"continuation has unknown key(s) {unknown}; "
                               "valid: ['indices', 'prefixes']")
        idx, pre = raw.get("indices"), raw.get("prefixes")
        if not isinstance(idx, list) or len(idx) != n_prompts:
            raise BackendError(f"continuation.indices must be a list of {n_prompts} "
                               "integers, one per prompt")
        for k, i in enumerate(idx):
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= 2**31:
                raise BackendError(f"continuation.indices[{k}] must be an integer in "
                                   f"0..2**31, got {i!r}")
        if len(set(idx)) != len(idx):
            raise BackendError("continuation.indices has duplicates: each prompt is one "
                               "place in the batch")
        if not isinstance(pre, list) or len(pre) != n_prompts:
            raise BackendError(f"continuation.prefixes must be a list of {n_prompts} "
                               "token-id lists, one per prompt")
        for k, p in enumerate(pre):
            if not is_token_ids(p) or len(p) > MAX_PREFIX_TOKENS:
                raise BackendError(f"continuation.prefixes[{k}] must be a list of at most "
                                   f"{MAX_PREFIX_TOKENS} token ids (integers in "
                                   "0..2**63-1)")
        return cls(tuple(idx), tuple(tuple(p) for p in pre))

    def to_json(self) -> dict[str, Any]:
        return {"indices": list(self.indices), "prefixes": [list(p) for p in self.prefixes]}


@dataclass(frozen=True)
class Sample:
    """One generated completion.

    `finish_step` is the decode step (0-based, within its micro-batch; for a continued
    sequence, counted from its prefix's start) at which the sample ended; `finish_rank`
    its rank in the order all samples of the call finished.
    """

    prompt: str
    completion: str
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    finish_reason: str  #: "stop" (end token) or "length" (max_tokens reached)
    finish_step: int
    finish_rank: int

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "completion": self.completion,
            "prompt_ids": list(self.prompt_ids),
            "completion_ids": list(self.completion_ids),
            "finish_reason": self.finish_reason,
            "finish_step": self.finish_step,
            "finish_rank": self.finish_rank,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Sample:
        return cls(
            prompt=raw["prompt"],
            completion=raw["completion"],
            prompt_ids=tuple(raw["prompt_ids"]),
            completion_ids=tuple(raw["completion_ids"]),
            finish_reason=raw["finish_reason"],
            finish_step=raw["finish_step"],
            finish_rank=raw["finish_rank"],
        )

    def with_advantage(self, advantage: float) -> TrainSample:
        """This sample as a policy-gradient sample for a trainer."""
        return TrainSample(self.prompt_ids, self.completion_ids, float(advantage))


@dataclass(frozen=True)
class GenerateResult:
    """Outputs of `generate`, in prompt order, plus the long-tail trace.

    `active_trace[i]` is the number of sequences still unfinished (in all micro-batches)
    after global decode step `i`: the curve a lease shrink is decided on.
    """

    samples: tuple[Sample, ...]
    active_trace: tuple[int, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {
            "samples": [s.to_json() for s in self.samples],
            "active_trace": list(self.active_trace),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> GenerateResult:
        return cls(
            samples=tuple(Sample.from_json(s) for s in raw["samples"]),
            active_trace=tuple(raw.get("active_trace", ())),
        )


@dataclass(frozen=True)
class TrainSample:
    """One sample of a policy-gradient batch: token ids and its advantage."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    advantage: float

    @classmethod
    def from_json(cls, raw: Any, index: int) -> TrainSample:
        if not isinstance(raw, Mapping):
            raise BackendError(f"samples[{index}] must be an object")
        allowed = {"prompt_ids", "completion_ids", "advantage", "prompt", "completion"}
        unknown = sorted(set(raw) - allowed)
        if unknown:
            raise BackendError(f"samples[{index}] has unknown key(s) {unknown}")
        ids: dict[str, tuple[int, ...]] = {}
        for key in ("prompt_ids", "completion_ids"):
            value = raw.get(key)
            if not is_token_ids(value):
                raise BackendError(f"samples[{index}].{key} must be a list of token ids "
                                   "(integers in 0..2**63-1)")
            ids[key] = tuple(value)
        if not ids["completion_ids"]:
            raise BackendError(f"samples[{index}].completion_ids is empty")
        adv = raw.get("advantage")
        if isinstance(adv, bool) or not isinstance(adv, (int, float)):
            raise BackendError(f"samples[{index}].advantage must be a number")
        try:
            adv = float(adv)
        except OverflowError:  # an integer too large for a float
            raise BackendError(f"samples[{index}].advantage must be finite, got an "
                               "integer too large for a float") from None
        if not math.isfinite(adv):  # one NaN step would poison the resident weights
            raise BackendError(f"samples[{index}].advantage must be finite, got {adv} "
                               "(a group of equal rewards normalised by a zero std?)")
        return cls(ids["prompt_ids"], ids["completion_ids"], adv)

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt_ids": list(self.prompt_ids),
            "completion_ids": list(self.completion_ids),
            "advantage": self.advantage,
        }


@dataclass(frozen=True)
class MemoryUse:
    """Bytes a backend holds on its device and in host buffers for parked state."""

    device_bytes: int
    host_bytes: int

    def to_json(self) -> dict[str, int]:
        return {"device_bytes": self.device_bytes, "host_bytes": self.host_bytes}


@runtime_checkable
class ServiceBackend(Protocol):
    """One resident model. Calls come from one thread at a time.

    Data-plane calls (`generate`, `train_step`, `export_weights`) raise `NotReady`
    unless `residency` is ACTIVE. `import_weights` is also accepted while PARKED or
    DROPPED: the weights are checked and staged in host memory, nothing runs on the
    device, and `activate` applies them (for a DROPPED rollout that is its refill).
    """

    name: str
    role: Role

    @property
    def residency(self) -> Residency: ...

    @property
    def staged(self) -> bool:
        """Whether weights imported while parked wait for the next `activate`."""

    def load(self) -> None:
        """Build the model on its device; afterwards residency is ACTIVE."""

    def park(self, level: int) -> None:
        """Free device memory: level 1 keeps weights on the host, level 2 drops them.

        A no-op when DROPPED, or PARKED at level 1. Level 2 when PARKED: frees the host
        copy (DROPPED) where the backend can, else changes nothing (see the module's
        docstring: the caller reads `residency` for which happened)."""

    def activate(self) -> None:
        """Bring parked state back onto the device; a no-op when already ACTIVE."""

    def generate(self, prompts: Sequence[str], params: GenerateParams,
                 cont: Continuation | None = None) -> GenerateResult: ...

    def train_step(self, samples: Sequence[TrainSample]) -> dict[str, float]: ...

    def export_weights(self) -> bytes:
        """The model's weights as a `torch.save`d state_dict."""

    def import_weights(self, blob: bytes) -> None:
        """Load weights exported by a peer (trainer -> rollout sync).

        ACTIVE: loaded at once. PARKED/DROPPED: staged in host memory and loaded by the
        next `activate`, which then generates with them; a blob that does not fit is
        refused (BackendError) either way.
        """

    @property
    def handed_off(self) -> bool:
        """Whether this copy handed its state to another copy and holds none."""

    @property
    def generation(self) -> int:
        """The generation of the state this copy holds (or last handed off); 0 at load."""

    def hand_off(self, path: Path) -> None:
        """From ACTIVE: write the whole state to `path` atomically (temp file, replace)
        with generation `generation + 1` if the state changed since this copy's
        generation, else `generation` (unless the file holds that generation or a
        newer one already: that state is kept and nothing written), then free its device
        and host copies; it is PARKED and `handed_off` afterwards (`memory()` reads ~0
        and 0). A no-op when already handed off; NotReady when PARKED, DROPPED or
        STOPPED."""

    def take_over(self, path: Path) -> None:
        """Load the state handed off to `path` onto the device; ACTIVE, not handed off,
        and at the file's generation afterwards. BackendError, changing nothing, for a
        missing or corrupt file, one older than `generation`, or one that does not fit
        the model (names and shapes, as `load_state_dict(strict=True)`)."""

    def memory(self) -> MemoryUse: ...

    def active_sequences(self) -> int:
        """Sequences still decoding right now (0 when idle); read from other threads."""

    def close(self) -> None:
        """Release everything; afterwards residency is STOPPED."""
