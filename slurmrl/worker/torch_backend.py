"""The `torch` backend: a PyTorch model resident on one device, parked to pinned host memory.

`TorchModelBackend` hosts any `nn.Module` that maps token ids [B, T] to logits
[B, T, V] (built by a factory named on the worker's command line as `module:callable`).
As a trainer it runs GRPO-style policy-gradient steps with Adam; parking copies the
parameters *and* the optimizer state into persistent pinned host buffers (allocated once,
non-blocking copies on a side stream, then `torch.cuda.empty_cache()`, see `offload.py`)
and activation copies them back, so training resumes exactly where it stopped.

A level-2 park (a rollout's drop) keeps no host copy of the weights: the pinned buffers
are freed (all but non-persistent buffers, which no weight import brings back), also
when the model was already parked at level 1 (its host copy, and any weights staged in
it, are freed then). That is the contract `ServiceBackend.park` states and the residency
planner counts on (`Footprint.drops_parked`).

Imported weights are checked whole before anything is copied (names, as
`load_state_dict(strict=True)` checks them; each a dense tensor of its parameter's
shape and dtype, or another floating-point dtype, cast): a refused import changes
nothing. Weights imported while parked (level 1 or 2) are staged: written into the
host buffers of the parked parameters, without touching the device; `activate` copies
them up with the rest of the parked state (and the weights are valid again, also where
a drop had left them invalid). That is how a disaggregated job's sync reaches a rollout
parked for a partner's phase: the rollout runs with the new weights on its next
activation, and nothing ran on its GPUs before.

A train step whose loss or gradient norm is not finite (an advantage beyond float32's
range) is refused (BackendError) before the optimizer steps: weights, optimizer state
and `steps` stay as they were.

Hand-off (floating pools, see `handoff.py`): `hand_off(path)` writes the whole state —
model state_dict and non-persistent buffers, the optimizer's state_dict (a trainer's
Adam moments and step counts), `steps`, `weights_version`, whether the weights are
valid, torch's random-number state (CPU, and the device's on CUDA: a model with dropout
draws on after a hand-off as it would have) and a generation number — to a node-local
file (unless it holds a newer generation, which is kept; the file is a JSON header and
the tensors' raw bytes, no pickle), then frees the device copies and the host buffers
(`Offloader.offload(keep_host_copy=False)`, `release_host()`): the copy is PARKED,
`handed_off`, and holds nothing. `take_over(path)` on another copy of the same service
(same class, model and role) maps the file and checks it against its model (names,
shapes and dtypes, where `load_state_dict(strict=True)` checks names and shapes; the
optimizer's groups, moment shapes and dtypes), reallocates device storage
(`onload(restore=False)`) and copies each tensor from the mapping into its own (the
optimizer's into its existing state tensors where it has them): training and sampling
continue as if one process had done it all (bit for bit, on CPU and, with deterministic
kernels, on an H200: `tests/unit/worker/test_worker_cuda.py`). A refused file (older
generation, missing, corrupt or truncated, not fitting) changes nothing. A handed-off
copy refuses a plain `activate` and weight imports: its state is in the file.

Limits: one device per service (no FSDP/TP sharding here); generation is not offered by
this backend (a rollout engine is `vllm`, or `tiny` for tests). The CUDA path ran on an
H200 (torch 2.11) once; its tests are marked `gpu` (CI has no GPU). The same class runs
on CPU (`device="cpu"`), which is how the unit tests and the
`tiny` backend exercise every line except the CUDA calls.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from slurmrl.model import Residency
from slurmrl.worker import handoff
from slurmrl.worker.lm import policy_gradient_loss
from slurmrl.worker.offload import Offloader, is_dense, on_index
from slurmrl.worker.protocol import (
    BackendError,
    Continuation,
    GenerateParams,
    GenerateResult,
    MemoryUse,
    NotReady,
    Role,
    TrainSample,
)


def resolve_device(spec: str) -> torch.device:
    """`cpu`, `cuda` or `cuda:N`; CUDA without a usable GPU is a clear error."""
    try:
        device = torch.device(spec)
    except RuntimeError as exc:
        raise BackendError(f"bad device {spec!r}: {exc}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BackendError(
            f"device {spec!r} needs a GPU but torch.cuda.is_available() is False "
            "(use --device cpu to run this backend on the CPU)"
        )
    if device.type not in ("cpu", "cuda"):
        raise BackendError(f"device {spec!r} is not supported; use cpu or cuda[:N]")
    return on_index(device)


class TorchModelBackend:
    """A model (and, for a trainer, its Adam optimizer) parked and activated as a unit."""

    name = "torch"

    def __init__(
        self,
        role: Role,
        model_factory: Callable[[], nn.Module],
        device: str = "cuda",
        lr: float = 1e-3,
        seed: int = 0,
    ) -> None:
        if not (math.isfinite(lr) and lr > 0):  # an infinite one made the weights NaN
            raise BackendError(f"learning rate must be a finite number > 0, got {lr}")
        self.role = role
        self.device = resolve_device(device)
        self._factory = model_factory
        self._lr = lr
        self._seed = seed
        self._model: nn.Module | None = None
        self._opt: torch.optim.Optimizer | None = None
        self._offloader = Offloader(self.device)
        self._residency = Residency.STOPPED
        self._weights_valid = False  # False after a level-2 drop until weights arrive
        self._staged = False  # weights imported while parked, waiting in host buffers
        self._active = 0
        self._handed_off = False  # the state is in a handoff file, not in this copy
        self._generation = 0  # of the state this copy holds (or last handed off)
        self.steps = 0
        self.weights_version = 0
        self._as_of = self._version()  # the state as of its generation (load, hand-offs)

    # --- residency ---------------------------------------------------------------

    @property
    def residency(self) -> Residency:
        return self._residency

    def load(self) -> None:
        torch.manual_seed(self._seed)  # same seed -> trainer and rollout start equal
        model = self._factory()
        if not isinstance(model, nn.Module):
            raise BackendError(f"the model factory returned {type(model).__name__}, not a Module")
        self._model = model.to(self.device)
        if self.role is Role.TRAINER:
            self._opt = torch.optim.Adam(self._model.parameters(), lr=self._lr)
        self._offloader.refresh(self._tensors())
        self._residency = Residency.ACTIVE
        self._weights_valid = True
        self._handed_off = False
        self._as_of = self._version()

    def _version(self) -> tuple[int, int, bool]:
        """What changes whenever the state does: steps (model and optimizer), weights
        imported, weights valid."""
        return self.steps, self.weights_version, self._weights_valid

    def park(self, level: int) -> None:
        if level not in (1, 2):
            raise BackendError(f"park level must be 1 (keep weights) or 2 (drop), got {level}")
        if self.role is Role.TRAINER and level == 2:
            raise BackendError("a trainer cannot be parked at level 2: its state would be lost")
        if self._residency is Residency.DROPPED or (
                self._residency is Residency.PARKED and (level == 1 or self._handed_off)):
            return  # a handed-off copy holds nothing to drop
        # a drop keeps what no weight import brings back: buffers outside the state_dict
        # (non-persistent, e.g. rotary frequencies), else they would come back as zeros
        keep = self._non_persistent() if level == 2 else ()
        if self._residency is Residency.PARKED:
            # from parked: the host copy goes (weights staged meanwhile with it); the
            # planner counts a dropped rollout as pinning no host memory
            self._offloader.release_host(keep=keep)
            self._staged = False
            self._residency = Residency.DROPPED
            return
        self._require(Residency.ACTIVE, "parking")
        if self._opt is not None:
            self._opt.zero_grad(set_to_none=True)  # grads are step-local: never kept
        self._offloader.refresh(self._tensors())  # optimizer state appears after step 1
        self._offloader.offload(keep_host_copy=level == 1, keep=keep)
        if level == 2:
            self._offloader.release_host(keep=keep)  # no host copy of what a drop drops
        self._residency = Residency.PARKED if level == 1 else Residency.DROPPED

    def activate(self) -> None:
        if self._residency is Residency.ACTIVE:
            return
        if self._residency is Residency.STOPPED:
            raise NotReady("service is stopped")
        if self._handed_off:
            raise NotReady(f"service handed its state (generation {self._generation}) to "
                           "another copy: activate it with handoff to take the state back")
        dropped = self._residency is Residency.DROPPED
        # host buffers hold the parked state, or (after a drop) only staged weights
        self._offloader.onload(restore=True)
        if self._staged:
            self._weights_valid = True  # a complete set of weights arrived while parked
        elif dropped:
            self._weights_valid = False
        self._staged = False
        self._residency = Residency.ACTIVE

    # --- hand-off between copies -------------------------------------------------------

    @property
    def handed_off(self) -> bool:
        """Whether this copy handed its state to another and holds none."""
        return self._handed_off

    @property
    def generation(self) -> int:
        """Generation of the state this copy holds (or last handed off); 0 at load."""
        return self._generation

    def hand_off(self, path: Path) -> None:
        """Write the whole state to `path` atomically, then free it here (PARKED).

        When `path` already holds a newer generation (this copy came up fresh, or fell
        behind), nothing is written: the newer state is kept, and this copy still frees
        its own and is handed off (its next activation takes the file over)."""
        if self._handed_off:
            return
        if self._residency is not Residency.ACTIVE or self._model is None:
            raise NotReady(f"service is {self._residency}: only an active service hands "
                           "its state off (the controller hands off the active copy)")
        model, opt = self._model, self._opt
        if opt is not None:
            opt.zero_grad(set_to_none=True)  # grads are step-local: never kept
        sd = model.state_dict()
        # a new generation only for a state that changed since its own: a copy that came
        # up fresh (or took a state over and did nothing) hands off the generation it
        # holds, so a fresh copy's hand-off on another node never ties with the job's
        # trained state handed off for the first time
        gen = self._generation + (self._version() != self._as_of)
        written = handoff.write_state(path, {
            "backend": self.name,
            "role": str(self.role),
            "model": {k: v.detach() for k, v in sd.items()},
            "buffers": {k: v.detach() for k, v in model.named_buffers() if k not in sd},
            "optimizer": None if opt is None else opt.state_dict(),
            "steps": self.steps,
            "weights_version": self.weights_version,
            "weights_valid": self._weights_valid,
            "rng": self._rng_state(),  # dropout and the like go on as in one process
        }, gen)
        # `sd` shares the parameters' storage: kept, the storage stays occupied through
        # the offload's empty_cache, and the GPU memory stays torch's, not the driver's
        del sd
        # from here on the file holds the state (this copy's, or a newer one that was
        # kept), and this copy gives its memory back
        self._offloader.refresh(self._tensors())
        self._offloader.offload(keep_host_copy=False)
        self._offloader.release_host()
        self._staged = False
        if written:
            self._generation, self._as_of = gen, self._version()
        self._handed_off = True
        self._residency = Residency.PARKED

    def take_over(self, path: Path) -> None:
        """Load the state another copy handed off to `path`; afterwards ACTIVE."""
        if self._residency is Residency.STOPPED or self._model is None:
            raise NotReady("service is stopped: take_over needs a loaded model")
        state = handoff.read_state(path)  # tensors: views of the file's mapping
        self._check_state(state, path)
        model, opt = self._model, self._opt
        # device storage for the state, nothing copied up; a failure (out of device
        # memory) leaves the copy as it was
        self._offloader.onload(restore=False)
        try:
            with torch.no_grad():
                # each tensor straight from the mapping into the model's own
                model.load_state_dict(state["model"], strict=True)
                for name, value in state["buffers"].items():
                    model.get_buffer(name).copy_(value)
                if opt is not None:
                    opt.load_state_dict(self._own_optimizer_state(state["optimizer"]))
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:
            # half loaded (what the checks did not foresee): hold nothing, say so
            self._offloader.refresh(self._tensors())
            self._offloader.offload(keep_host_copy=False)
            self._offloader.release_host()
            self._handed_off, self._residency = True, Residency.PARKED
            raise BackendError(f"handoff state {path} does not fit this model: {exc}; "
                               "this copy now holds no state") from exc
        self._set_rng_state(state.get("rng"))
        self.steps = state["steps"]
        self.weights_version = state["weights_version"]
        self._weights_valid = state["weights_valid"]
        self._generation = state["generation"]
        self._as_of = self._version()
        self._staged = False
        self._handed_off = False
        self._residency = Residency.ACTIVE

    def _rng_state(self) -> dict[str, torch.Tensor]:
        """The process's random-number state a training step draws from (CPU, and the
        device's on CUDA): handed off with the model, so a copy that takes over draws
        what this one would have."""
        out = {"cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            out["cuda"] = torch.cuda.get_rng_state(self.device)
        return out

    def _set_rng_state(self, got: dict[str, torch.Tensor] | None) -> None:
        """Take the hand-off's random-number state (checked by `_check_state`; none in a
        file of a release before it was kept)."""
        if got is None:
            return
        torch.set_rng_state(got["cpu"].clone())
        if self.device.type == "cuda" and "cuda" in got:
            torch.cuda.set_rng_state(got["cuda"].clone(), self.device)

    def _own_optimizer_state(self, got: dict[str, Any]) -> dict[str, Any]:
        """The file's optimizer state_dict with its tensors copied out of the mapping:
        into this optimizer's own state tensors where they fit (a copy that held state
        before: `onload` gave them storage again), else into new ones on the parameter's
        device (a 0-dim `step` on the CPU, where Adam keeps it unless capturable or fused;
        `load_state_dict` puts every tensor where its policy wants it)."""
        assert self._opt is not None
        params = self._optimizer_params()
        state: dict[int, dict[str, Any]] = {}
        for idx, entry in got["state"].items():
            mine = self._opt.state.get(params[idx], {})
            state[idx] = {}
            for key, value in entry.items():
                if isinstance(value, torch.Tensor):
                    have = mine.get(key)
                    if (isinstance(have, torch.Tensor) and have.shape == value.shape
                            and have.dtype == value.dtype):
                        value = have.copy_(value)
                    else:
                        device = params[idx].device if value.dim() else torch.device("cpu")
                        value = value.to(device, copy=True)
                state[idx][key] = value
        return {"state": state, "param_groups": got["param_groups"]}

    def _optimizer_params(self) -> dict[int, torch.Tensor]:
        """This optimizer's parameters by their index in its state_dict."""
        assert self._opt is not None
        mine = self._opt.state_dict()["param_groups"]
        return {i: p for m, g in zip(mine, self._opt.param_groups, strict=True)
                for i, p in zip(m["params"], g["params"], strict=True)}

    def _check_state(self, state: dict[str, Any], path: Path) -> None:
        """Refuse (BackendError) a state file this copy must not load; changes nothing."""
        assert self._model is not None
        bad = f"handoff state {path}"
        if state["generation"] < self._generation:
            raise BackendError(f"{bad} is generation {state['generation']}, older than "
                               f"this copy's {self._generation}: a stale hand-off")
        if state.get("backend") != self.name or state.get("role") != str(self.role):
            raise BackendError(f"{bad} was written by a {state.get('backend')} "
                               f"{state.get('role')}; this is a {self.name} {self.role}")
        for key in ("steps", "weights_version"):
            if isinstance(state.get(key), bool) or not isinstance(state.get(key), int):
                raise BackendError(f"{bad}: {key} must be an integer")
        if not isinstance(state.get("weights_valid"), bool):
            raise BackendError(f"{bad}: weights_valid must be true or false")
        rng = state.get("rng")
        if rng is not None and not (
                isinstance(rng, dict) and set(rng) <= {"cpu", "cuda"}
                and all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8
                        and t.dim() == 1 for t in rng.values())
                and "cpu" in rng and rng["cpu"].numel() == torch.get_rng_state().numel()):
            raise BackendError(f"{bad}: rng must be the random-number state of torch "
                               "(uint8 tensors, 'cpu' and on CUDA 'cuda')")
        sd = self._model.state_dict(keep_vars=True)
        extra = {k: b for k, b in self._model.named_buffers() if k not in sd}
        self._check_tensors(state.get("model"), sd, f"{bad} does not fit this model")
        self._check_tensors(state.get("buffers"), extra, f"{bad} does not fit this model's "
                            "non-persistent buffers")
        self._check_optimizer(state.get("optimizer"), bad)

    def _check_tensors(self, got: Any, want: dict[str, torch.Tensor], what: str) -> None:
        if not isinstance(got, dict):
            raise BackendError(f"{what}: no state_dict in it")
        missing, unexpected = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        if missing or unexpected:
            raise BackendError(f"{what}: missing keys {missing}, unexpected keys {unexpected}")
        for key, target in want.items():
            self._check_tensor(got[key], target, f"{what}: {key}")

    def _check_tensor(self, value: Any, target: torch.Tensor, what: str,
                      whose: str = "the model's") -> None:
        """`value` loads into `target` as it is: a tensor of its shape and dtype."""
        if not isinstance(value, torch.Tensor):
            raise BackendError(f"{what} is not a tensor")
        if value.shape != self._shape(target):
            raise BackendError(f"{what} has shape {tuple(value.shape)}, {whose} is "
                               f"{tuple(self._shape(target))}")
        if value.dtype != target.dtype:
            raise BackendError(f"{what} has dtype {value.dtype}, {whose} is {target.dtype}")

    def _check_optimizer(self, got: Any, bad: str) -> None:
        if self._opt is None:
            if got is not None:
                raise BackendError(f"{bad} carries optimizer state; this copy has none")
            return
        mine = self._opt.state_dict()["param_groups"]
        groups = got.get("param_groups") if isinstance(got, dict) else None
        state = got.get("state") if isinstance(got, dict) else None
        if (not isinstance(groups, list) or not isinstance(state, dict)
                or len(groups) != len(mine)
                or any(not isinstance(g, dict) or g.get("params") != m["params"]
                       for g, m in zip(groups, mine, strict=True))):
            raise BackendError(f"{bad}: its optimizer state does not fit this optimizer "
                               "(parameter groups differ)")
        params = self._optimizer_params()
        for idx, entry in state.items():
            if idx not in params or not isinstance(entry, dict):
                raise BackendError(f"{bad}: optimizer state for an unknown parameter {idx!r}")
            for key, value in entry.items():
                # Adam's moments are the parameter's shape and dtype; its `step` is 0-dim
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    self._check_tensor(value, params[idx], f"{bad}: optimizer state {key} "
                                       f"of parameter {idx}", "the parameter's")

    def _shape(self, tensor: torch.Tensor) -> torch.Size:
        """A tensor's shape on the device, also while offloaded."""
        shape = self._offloader.shape_of(tensor) if self._offloader.offloaded else None
        return tensor.shape if shape is None else shape

    # --- data plane ----------------------------------------------------------------

    def generate(self, prompts: Sequence[str], params: GenerateParams,
                 cont: Continuation | None = None) -> GenerateResult:
        raise BackendError(
            f"the {self.name} backend does not generate; run generation on a rollout service"
        )

    def train_step(self, samples: Sequence[TrainSample]) -> dict[str, float]:
        if self.role is not Role.TRAINER:
            raise BackendError(f"train_step is a trainer call; this service is a {self.role}")
        model, opt = self._ready("train_step")
        assert opt is not None
        if not samples:
            raise BackendError("train_step needs at least one sample")
        model.train()
        loss, n_tokens = policy_gradient_loss(model, samples, self.device)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        value = float(loss.detach())
        if not (math.isfinite(value) and math.isfinite(grad_norm)):
            # one such step would make the weights NaN for good: none is taken
            opt.zero_grad(set_to_none=True)
            raise BackendError(f"step not applied: non-finite loss/gradient (loss {value}, "
                               f"grad norm {grad_norm}; an advantage beyond float32's "
                               "range?); the weights and optimizer state are unchanged")
        opt.step()
        self.steps += 1
        self.weights_version += 1
        return {
            "loss": value,
            "grad_norm": grad_norm,
            "tokens": float(n_tokens),
            "step": float(self.steps),
        }

    def export_weights(self) -> bytes:
        model, _ = self._ready("export_weights")
        state = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
        buf = io.BytesIO()
        torch.save(state, buf)
        return buf.getvalue()

    def import_weights(self, blob: bytes) -> None:
        """Load weights now when ACTIVE; when parked, stage them for the next activate."""
        if self._residency is Residency.STOPPED or self._model is None:
            raise NotReady("service is stopped: import_weights needs a loaded model")
        if self._handed_off:
            raise NotReady("service handed its state to another copy: import weights "
                           "into the copy that holds it")
        state = self._parse_weights(blob)
        self._check_weights(state)  # all of it, before anything is copied
        if self._residency is not Residency.ACTIVE:
            self._stage(state)
            return
        try:
            with torch.no_grad():
                self._model.load_state_dict(state, strict=True)
        except (RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
            self._weights_valid = False  # what the checks did not foresee: half loaded
            raise BackendError(f"weights do not fit this model: {exc}; its weights are "
                               "now partly replaced: import a complete set") from exc
        self._weights_valid = True
        self.weights_version += 1

    @property
    def staged(self) -> bool:
        """Whether weights imported while parked wait for the next activation."""
        return self._staged

    def _check_weights(self, state: dict[Any, Any]) -> None:
        """Refuse (BackendError) weights that would not load as they are: every key of
        the model's state_dict and no other, each a dense tensor of its shape, and of
        its dtype or, for floating-point weights, another floating-point one (cast as
        `load_state_dict` casts it)."""
        assert self._model is not None
        bad = "weights do not fit this model"
        targets = self._model.state_dict(keep_vars=True)
        missing = sorted(set(targets) - set(state))
        unexpected = sorted(set(state) - set(targets), key=repr)  # keys of any type
        if missing or unexpected:
            raise BackendError(f"{bad}: missing keys {missing}, unexpected keys {unexpected}")
        for key, target in targets.items():
            value = state[key]
            if not isinstance(value, torch.Tensor):
                raise BackendError(f"{bad}: {key} is not a tensor")
            if not is_dense(value):
                raise BackendError(f"{bad}: {key} is a {value.layout} tensor"
                                   f"{' (quantized)' * value.is_quantized}"
                                   f"{' (meta)' * value.is_meta}, not a dense one with "
                                   "its values")
            if value.shape != self._shape(target):
                raise BackendError(f"{bad}: {key} has shape {tuple(value.shape)}, which "
                                   f"does not match the model's {tuple(self._shape(target))}")
            if value.dtype != target.dtype and not (value.is_floating_point()
                                                    and target.is_floating_point()):
                raise BackendError(f"{bad}: {key} has dtype {value.dtype}, the model's is "
                                   f"{target.dtype}")

    def _stage(self, state: dict[str, torch.Tensor]) -> None:
        """Write checked weights (`_check_weights`) into the parked host buffers."""
        assert self._model is not None
        pairs = []
        for key, target in self._model.state_dict(keep_vars=True).items():
            value = state[key]
            if self._offloader.shape_of(target) is None:
                if value.numel() == 0:
                    continue  # an empty tensor the offloader never tracked
                raise BackendError(f"weights do not fit this model: {key} is not parked")
            pairs.append((target, value))
        try:
            # a dropped model holds no host buffers for its weights: allocated for them
            self._offloader.write_host(pairs,
                                       allocate=self._residency is Residency.DROPPED)
        except ValueError as exc:  # refused before any write
            raise BackendError(f"weights do not fit this model: {exc}") from exc
        except (RuntimeError, TypeError, NotImplementedError) as exc:
            # what the checks did not foresee, mid-way: the parked weights are torn
            self._staged, self._weights_valid = False, False
            raise BackendError(f"weights do not fit this model: {exc}; the parked "
                               "weights are now partly replaced: import a complete "
                               "set") from exc
        self._staged = True
        self.weights_version += 1

    @staticmethod
    def _parse_weights(blob: bytes) -> dict[str, torch.Tensor]:
        try:
            state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises several types for a corrupt blob
            raise BackendError(f"weights blob is not a torch state_dict: {exc}") from exc
        if not isinstance(state, dict):
            raise BackendError("weights blob is not a state_dict (a dict of tensors)")
        return state

    def memory(self) -> MemoryUse:
        if self._model is None:
            return MemoryUse(0, 0)
        if not self._offloader.offloaded:
            self._offloader.refresh(self._tensors())
        device = 0 if self._offloader.offloaded else self._offloader.device_bytes()
        return MemoryUse(device_bytes=device, host_bytes=self._offloader.host_bytes())

    def active_sequences(self) -> int:
        return self._active

    def close(self) -> None:
        self._model = None
        self._opt = None
        self._offloader = Offloader(self.device)
        self._residency = Residency.STOPPED
        self._handed_off = False
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # --- helpers ---------------------------------------------------------------------

    def _non_persistent(self) -> list[torch.Tensor]:
        """The model's buffers that its state_dict leaves out (`persistent=False`)."""
        assert self._model is not None
        kept = {id(v) for v in self._model.state_dict(keep_vars=True).values()}
        return [b for b in self._model.buffers() if id(b) not in kept]

    def _tensors(self) -> Iterator[torch.Tensor]:
        assert self._model is not None
        yield from self._model.parameters()
        yield from self._model.buffers()
        if self._opt is not None:
            for state in self._opt.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        yield value

    def _require(self, wanted: Residency, what: str) -> None:
        if self._residency is not wanted:
            raise NotReady(
                f"service is {self._residency}: {what} needs it {wanted} "
                "(the controller activates it when its job holds a lease)"
            )

    def _ready(self, what: str) -> tuple[nn.Module, torch.optim.Optimizer | None]:
        self._require(Residency.ACTIVE, what)
        if not self._weights_valid:
            raise NotReady(
                f"weights were dropped (park level 2) or partly replaced by a failed "
                f"import: import weights before {what}"
            )
        assert self._model is not None
        return self._model, self._opt
