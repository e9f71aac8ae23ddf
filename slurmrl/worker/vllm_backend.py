"""The `vllm` backend: a vLLM rollout engine kept resident with sleep mode.

NOT RUN ON A GPU IN THIS PROJECT. The development machine has no GPU and vLLM is not
installed in CI (it is the optional extra `slurmrl[vllm]`); this module is written
against vLLM's documented offline API (`LLM(..., enable_sleep_mode=True)`, `sleep`,
`wake_up(tags=...)`, `reset_prefix_cache`, `collective_rpc` with a
`worker_extension_cls`); here only its import guard, argument checks and the calls it
makes of FAKE `vllm` modules, engines and NVML are tested (tests/unit/worker/).

Residency:
- park(2) → `llm.sleep(level=2)`: weights and KV cache discarded (DROPPED). The next
  weight sync refills them: activate wakes only the weights' memory
  (`wake_up(tags=["weights"])`), `import_weights` loads the trainer's weights and then
  wakes the KV cache (`wake_up(tags=["kv_cache"])`) and resets the prefix cache. Waking
  both at once would need peak memory during the refit, and generating from level-2
  weights without a reload gives gibberish (vllm#29341) — so `generate` refuses until
  weights were imported.
- park(1) → `llm.sleep(level=1)`: weights copied to pinned host memory (PARKED);
  activate → `wake_up()`. Its host memory (`memory().host_bytes`) is the weights'
  bytes, summed over the engine's workers (`WeightSyncExtension.slurmrl_weights_bytes`
  at load): what vLLM copies to the host, not what NVML saw freed (that includes the
  discarded KV cache).
- park(2) of a PARKED engine changes nothing: vLLM's executor ignores a `sleep` while
  it sleeps ("Executor is already sleeping"), and the CPU copy of the weights goes only
  with a wake, which needs the GPU memory back. It stays PARKED, pinning its host copy,
  and says so; the residency planner does not count on freeing it
  (`controller/residency.py`, `DROPS_PARKED_BACKENDS`).
- Weights imported while asleep (a disaggregated job's sync leases the trainer's GPUs
  only, and a partner may hold this rollout's) are staged: the blob is checked to be a
  state_dict of tensors and kept in this process's host memory; nothing is sent to the
  engine. The next activate wakes the weights' memory only (`wake_up(tags=["weights"])`;
  at level 1 that copies the old weights back first: vLLM offers no wake without it),
  loads the staged weights, then wakes the KV cache and resets the prefix cache — the
  same order as the level-2 refill. An active engine loads imported weights at once.
- A weight load goes to the engine's workers as a file, not as bytes (vLLM's engine core
  runs in a child process, and msgpack, which carries `collective_rpc`'s arguments there,
  takes no bytes object of 4 GiB or more): the blob is written to a file only this
  user can read (0600 in a fresh 0700 directory, in /dev/shm where it exists), each
  worker maps it (`torch.load(path, mmap=True, weights_only=True)`), and it is removed
  after the load, failed or not. vLLM's `load_weights` copies tensor by tensor, so a
  blob that does not fit (an unknown name, a wrong shape) may leave the model partly
  replaced: the load is a BackendError, and `generate` refuses until a complete set
  was imported. Staged weights that fail so make that activation a BackendError (the
  engine is then active without valid weights, and the staged blob is gone).
Memory: the engine is started with the GPU memory the residency planner counts for it
(`services.sizing_env` passes `--gpu-memory-bytes` and `--kv-cache-bytes` in the
step's environment, from `estimate.rollout_budget`, and for a rollout over several GPUs
`--tensor-parallel-size`, their number: the planner shards the weights over them):
`kv_cache_memory_bytes` sizes its KV cache (vLLM >= 0.11; slurmrl asks for >= 0.16),
and `gpu_memory_utilization` is that footprint's share of the GPU's total memory
(NVML), which vLLM checks is free at start. Without a budget it takes
`gpu_memory_utilization` as given (0.85: most of the GPU, which the planner does not
know).

Sampling: `temperature` in 0..2 and seeds in 0..2**63-1 (`GenerateParams`); each
sequence's vLLM seed is `protocol.sequence_seed` (within signed 64 bits). A sampling
parameter vLLM refuses is a BackendError, not a crash of the call, and so is a request
its engine refuses (a prompt over `max_model_len`, an id outside the vocabulary).
Reproducible across batch splits only with vLLM's batch-invariant kernels: without
them a sequence's logits depend on what it is batched with. They are off unless the
site sets `VLLM_BATCH_INVARIANT=1` in the controller's environment, which services
inherit (`services.PASS_THROUGH`): vLLM's docs call them beta and slower, for NVIDIA
GPUs of compute capability 9.0 or more (8.0 in later releases); not run here.

Pausing: the server runs one backend call at a time, so no request is in flight when
`sleep` runs (sleeping mid-request is a known corruption). After each sleep the freed
memory is checked with NVML per-process readings over this process and its children
(vLLM's engine core runs in a child process), not trusted from the call returning.

Hand-off: not offered. `hand_off`/`take_over` (floating pools: handing the state to a
copy of the service on another GPU window) raise BackendError; floating pools need a
backend that can, `torch` or `tiny`.

Limits: one engine per process (vLLM's own limit with sleep mode); pinned host memory
vLLM allocated for a level-1 sleep is not given back after the wake (vllm#16663: torch's
pinned-memory cache keeps it), so `memory()` reads 0 host bytes while the process still
holds them, until the next sleep reuses them; the CUDA context,
CUDA-graph pool and NCCL buffers are never freed (~1 GiB per GPU); `import_weights`
needs host memory for the blob twice while it loads (the upload and its file; in
/dev/shm, memory too), and a worker killed mid-load leaves the file behind; large
tensor-parallel models want NCCL weight transfer instead; exporting weights from a
rollout is not offered. Weight names must be the Hugging Face names vLLM's
`load_weights` expects. A staged blob is held in host memory (reported in `memory()`)
until activation, also for a dropped rollout, whose footprint the controller counts as
pinning none.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from slurmrl.gpu.nvml import NvmlMonitor, descendant_pids
from slurmrl.model import Residency
from slurmrl.worker.protocol import (
    BackendError,
    Continuation,
    GenerateParams,
    GenerateResult,
    MemoryUse,
    NotReady,
    Role,
    Sample,
    TrainSample,
    sequence_seed,
)

log = logging.getLogger("slurmrl.worker.vllm")
#: the range of `gpu_memory_utilization` this backend passes vLLM
MIN_UTIL, MAX_UTIL = 0.05, 0.99
EXTENSION = "slurmrl.worker.vllm_backend.WeightSyncExtension"
_NO_HANDOFF = ("the vllm backend cannot hand its state to another copy of the service: "
               "floating pools need a backend that can (torch or tiny)")


class WeightSyncExtension:
    """Mixed into each vLLM GPU worker (`worker_extension_cls`); runs there, not here."""

    model_runner: Any  # provided by the vLLM worker this class extends

    def slurmrl_load_weights(self, path: str) -> int:
        """Load the state_dict `torch.save`d at `path` (mapped, not read whole)."""
        import torch

        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        self.model_runner.model.load_weights(weights=list(state.items()))
        return len(state)

    def slurmrl_weights_bytes(self) -> int:
        """Bytes of this worker's model tensors (parameters and buffers): what a level-1
        sleep copies to pinned host memory."""
        model = self.model_runner.model
        tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
        return sum(t.numel() * t.element_size() for t in tensors.values())


def _check_state_dict(blob: bytes) -> None:
    """Refuse a blob that is not a `torch.save`d dict of named tensors (BackendError)."""
    import torch

    try:
        state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for a corrupt blob
        raise BackendError(f"weights blob is not a torch state_dict: {exc}") from exc
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise BackendError("weights blob is not a state_dict (a dict of named tensors)")


@contextlib.contextmanager
def _private_file(blob: bytes) -> Iterator[str]:
    """`blob` in a new file only this user can read (0600, in a fresh 0700 directory
    under /dev/shm where it exists, else the system's temp dir), removed on exit."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="slurmrl-weights-", dir=base) as folder:
        path = os.path.join(folder, "weights.pt")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        yield path


class VllmBackend:
    """A vLLM `LLM` engine as a rollout service."""

    name = "vllm"
    role = Role.ROLLOUT

    def __init__(self, model: str, seed: int = 0, gpu_memory_utilization: float = 0.85,
                 tensor_parallel_size: int = 1, kv_cache_bytes: int | None = None,
                 gpu_memory_bytes: int | None = None) -> None:
        if not MIN_UTIL <= gpu_memory_utilization <= MAX_UTIL:
            raise BackendError(
                f"gpu_memory_utilization must be in {MIN_UTIL}..{MAX_UTIL}, got "
                f"{gpu_memory_utilization}"
            )
        for name, value in (("kv_cache_bytes", kv_cache_bytes),
                            ("gpu_memory_bytes", gpu_memory_bytes)):
            if value is not None and value <= 0:
                raise BackendError(f"{name} must be > 0, got {value}")
        self.model = model
        self._seed = seed
        self._util = gpu_memory_utilization
        self._tp = tensor_parallel_size
        self._kv_bytes = kv_cache_bytes
        self._gpu_bytes_planned = gpu_memory_bytes
        #: model tensors over the engine's workers, read at load (None: unknown)
        self._weights_bytes: int | None = 0
        self._llm: Any = None
        self._residency = Residency.STOPPED
        self._kv_asleep = False
        self._weights_valid = False
        self._no_weights = "not loaded"  #: why, while not `_weights_valid`
        self._active = 0
        self._nvml = NvmlMonitor()
        self._host_bytes = 0
        self._staged: bytes | None = None  # weights imported while asleep
        self.last_freed_bytes: int | None = None

    @property
    def residency(self) -> Residency:
        return self._residency

    def load(self) -> None:
        try:
            from vllm import LLM
        except ImportError as exc:
            raise BackendError(
                f"the vllm backend needs vLLM: pip install 'slurmrl[vllm]' ({exc})"
            ) from exc
        self._llm = LLM(
            model=self.model,
            enable_sleep_mode=True,
            seed=self._seed,
            tensor_parallel_size=self._tp,
            worker_extension_cls=EXTENSION,
            **self.memory_args(),
        )
        self._residency = Residency.ACTIVE
        self._weights_valid = True
        try:
            self._weights_bytes = sum(
                int(n) for n in self._llm.collective_rpc("slurmrl_weights_bytes"))
        except Exception as exc:  # a figure for the record: never fail a loaded engine
            log.warning("the engine's weights could not be sized (%s): a level-1 park "
                        "reports what NVML saw freed, the KV cache included", exc)
            self._weights_bytes = None

    def memory_args(self) -> dict[str, Any]:
        """The memory arguments of `vllm.LLM`: the planned KV cache
        (`kv_cache_memory_bytes`) and the planned footprint's share of the smallest of
        this engine's GPUs (`gpu_memory_utilization`, which vLLM checks is free at start
        and, without a KV budget, fills); the configured share where no budget or no
        NVML reading of the GPU's size is at hand."""
        args: dict[str, Any] = {"gpu_memory_utilization": self._util}
        if self._kv_bytes is not None:
            args["kv_cache_memory_bytes"] = self._kv_bytes
        if self._gpu_bytes_planned is None:
            log.warning("no planned GPU memory for this engine: vLLM may take %.0f%% of "
                        "the GPU, which the residency planner does not count", 100 * self._util)
            return args
        total = self._gpu_total()
        if total is None:
            log.warning("GPU size unknown (NVML: %s): vLLM starts with "
                        "gpu_memory_utilization=%s", self._nvml.reason or "no reading",
                        self._util)
            return args
        share = self._gpu_bytes_planned / total
        if not MIN_UTIL <= share <= MAX_UTIL:
            log.warning("planned %d bytes are %.3f of the GPU's %d: clamped to %s..%s",
                        self._gpu_bytes_planned, share, total, MIN_UTIL, MAX_UTIL)
        args["gpu_memory_utilization"] = min(MAX_UTIL, max(MIN_UTIL, share))
        return args

    def _gpu_total(self) -> int | None:
        """The total memory of the smallest GPU this engine runs on (the first
        `tensor_parallel_size` of CUDA_VISIBLE_DEVICES), from NVML; None if unknown."""
        try:
            gpus = self._nvml.visible()[: self._tp]
            totals = [self._nvml.read(i).memory_total_bytes for i in gpus]
        except Exception as exc:  # NVML's errors, or no NVML at all
            log.warning("reading the GPU's size failed: %s", exc)
            return None
        if not totals or any(t is None for t in totals):
            return None
        return min(t for t in totals if t is not None)

    def _gpu_bytes(self) -> int | None:
        return self._nvml.process_memory(descendant_pids(os.getpid()))

    def park(self, level: int) -> None:
        if level not in (1, 2):
            raise BackendError(f"park level must be 1 (keep weights) or 2 (drop), got {level}")
        if self._residency is Residency.PARKED and level == 2:
            # vLLM cannot go deeper asleep, nor drop the CPU copy without a wake: stays
            # PARKED, as the answer says (protocol.py: the planner does not count on it)
            log.info("park(level=2) of a parked vLLM engine: it stays parked with its "
                     "weights in host memory (a sleeping engine cannot drop them)")
            return
        if self._residency in (Residency.PARKED, Residency.DROPPED):
            return
        if self._residency is not Residency.ACTIVE:
            raise NotReady(f"service is {self._residency}: cannot park")
        before = self._gpu_bytes()
        if self._kv_asleep:
            # woken for a refit that has not come (weights only): vLLM's sleep does
            # nothing while any of its memory sleeps, so wake the rest first
            self._llm.wake_up(tags=["kv_cache"])
            self._kv_asleep = False
        self._llm.sleep(level=level)
        after = self._gpu_bytes()
        self.last_freed_bytes = None if before is None or after is None else before - after
        if self.last_freed_bytes is not None and self.last_freed_bytes <= 0:
            log.warning("vLLM sleep(level=%d) freed no GPU memory (NVML: %s -> %s bytes)",
                        level, before, after)
        # level 1: the weights' bytes went to pinned host memory (what NVML saw freed
        # holds the discarded KV cache too); level 2: nothing did
        weights = (self.last_freed_bytes or 0) if self._weights_bytes is None else (
            self._weights_bytes)
        self._host_bytes = weights if level == 1 else 0
        self._residency = Residency.PARKED if level == 1 else Residency.DROPPED

    def activate(self) -> None:
        if self._residency is Residency.ACTIVE:
            return
        staged = self._staged  # kept until the engine woke for it
        if self._residency is Residency.PARKED and staged is None:
            self._llm.wake_up()
        elif self._residency in (Residency.PARKED, Residency.DROPPED):
            self._llm.wake_up(tags=["weights"])  # KV waits until the refit is done
            self._kv_asleep = True
            self._weights_valid = False
            self._no_weights = ("dropped by a level-2 park" if staged is None
                                else "the weights imported while parked failed to load")
        else:
            raise NotReady(f"service is {self._residency}")
        self._host_bytes = 0
        self._residency = Residency.ACTIVE
        self._staged = None
        if staged is not None:
            try:
                self._load(staged)  # wakes the KV cache once the new weights are in
            except BackendError as exc:
                raise BackendError(f"the weights imported while parked were not loaded: "
                                   f"{exc}") from exc

    def generate(self, prompts: Sequence[str], params: GenerateParams,
                 cont: Continuation | None = None) -> GenerateResult:
        from vllm import SamplingParams

        if self._residency is not Residency.ACTIVE:
            raise NotReady(f"service is {self._residency}: activate it before generate")
        if not self._weights_valid:
            raise NotReady(f"weights are not loaded ({self._no_weights}): import weights "
                           "first")
        indices = (list(cont.indices) if cont is not None
                   else [params.first_index + k for k in range(len(prompts))])
        tok = self._llm.get_tokenizer() if cont is not None else None
        samples: list[Sample] = []
        ends: list[tuple[int, int]] = []
        self._active = len(prompts)
        try:
            # micro-batches so that active_sequences() shrinks as the calls return;
            # inside one micro-batch vLLM batches continuously and reports nothing
            for start in range(0, len(prompts), params.micro_batch):
                chunk = list(prompts[start : start + params.micro_batch])
                # a sequence's seed is its place in the whole batch; a continued one is
                # sampled anew from its cut (vLLM's per-request generator cannot resume)
                try:
                    sps = [SamplingParams(temperature=params.temperature,
                                          max_tokens=params.max_tokens,
                                          seed=sequence_seed(params.seed, indices[start + i]))
                           for i in range(len(chunk))]
                except ValueError as exc:  # vLLM's own checks (VLLMValidationError)
                    raise BackendError(f"vLLM refused the sampling parameters: {exc}") from exc
                heads: list[tuple[int, ...]] = [()] * len(chunk)
                inputs: list[Any] = chunk
                if cont is not None and tok is not None:
                    heads = list(cont.prefixes[start : start + len(chunk)])
                    # the prompt's ids and the completion so far, as a TokensPrompt
                    inputs = [{"prompt_token_ids": [*tok.encode(p), *h]}
                              for p, h in zip(chunk, heads, strict=True)]
                try:
                    outs = self._llm.generate(inputs, sps, use_tqdm=False)
                except ValueError as exc:  # e.g. a prompt over max_model_len
                    raise BackendError(f"vLLM refused the request: {exc}") from exc
                for i, out in enumerate(outs):
                    comp = out.outputs[0]
                    head = heads[i]
                    ids = (*head, *comp.token_ids)
                    prompt_ids = tuple(out.prompt_token_ids or ())
                    if head:
                        prompt_ids = prompt_ids[: len(prompt_ids) - len(head)]
                    # as comp.text: without special tokens (token_ids hold the EOS)
                    text = comp.text if not head or tok is None else tok.decode(
                        list(ids), skip_special_tokens=True)
                    ends.append((start * params.max_tokens + len(comp.token_ids), start + i))
                    samples.append(Sample(chunk[i], text, prompt_ids, ids,
                                          str(comp.finish_reason), max(len(ids) - 1, 0), 0))
                self._active = len(prompts) - start - len(chunk)
        finally:
            self._active = 0
        rank = {k: r for r, (_, k) in enumerate(sorted(ends))}
        return GenerateResult(tuple(
            Sample(s.prompt, s.completion, s.prompt_ids, s.completion_ids, s.finish_reason,
                   s.finish_step, rank[k]) for k, s in enumerate(samples)))

    def train_step(self, samples: Sequence[TrainSample]) -> dict[str, float]:
        raise BackendError("train_step is a trainer call; this service is a vllm rollout")

    def export_weights(self) -> bytes:
        raise BackendError("the vllm rollout does not export weights; export from the trainer")

    def import_weights(self, blob: bytes) -> None:
        if self._residency in (Residency.PARKED, Residency.DROPPED):
            _check_state_dict(blob)  # a bad blob is refused now, not at activation
            self._staged = bytes(blob)
            return
        if self._residency is not Residency.ACTIVE:
            raise NotReady(f"service is {self._residency}: import_weights needs the engine")
        self._load(blob)

    @property
    def staged(self) -> bool:
        """Whether weights imported while asleep wait for the next activation."""
        return self._staged is not None

    def _load(self, blob: bytes) -> None:
        try:
            with _private_file(blob) as path:
                self._weights_valid = False  # load_weights copies tensor by tensor
                try:
                    self._llm.collective_rpc("slurmrl_load_weights", args=(path,))
                except Exception as exc:  # vLLM's and the model's, from its workers
                    self._no_weights = f"the last import failed: {exc}"
                    raise BackendError(f"weights do not fit the model ({exc}); partly "
                                       "replaced: import a complete set") from exc
        except OSError as exc:  # no file to hand the engine: nothing was sent
            raise BackendError(f"cannot write the weights for the engine: {exc}") from exc
        if self._kv_asleep:
            self._llm.wake_up(tags=["kv_cache"])
            self._kv_asleep = False
        self._llm.reset_prefix_cache()  # cached prefixes were computed with old weights
        self._weights_valid = True

    @property
    def handed_off(self) -> bool:
        return False  # it never hands off

    @property
    def generation(self) -> int:
        return 0

    def hand_off(self, path: Path) -> None:
        raise BackendError(_NO_HANDOFF)

    def take_over(self, path: Path) -> None:
        raise BackendError(_NO_HANDOFF)

    def memory(self) -> MemoryUse:
        staged = len(self._staged) if self._staged is not None else 0
        return MemoryUse(device_bytes=self._gpu_bytes() or 0,
                         host_bytes=self._host_bytes + staged)

    def active_sequences(self) -> int:
        return self._active

    def close(self) -> None:
        self._llm = None
        self._staged = None
        self._residency = Residency.STOPPED
        self._nvml.close()
