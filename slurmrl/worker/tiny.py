"""The `tiny` backend: a real small PyTorch model on CPU, for tests and the demo.

It is the `torch` backend (same park/activate, hand-off, train step, weight
export/import) with `TinyLM` on the CPU, plus generation. On CPU, "parking" copies the
state into host buffers and frees the tensors the model was using: a CPU stand-in that
exercises the same protocol as a GPU service (buffers allocated once, copy, free,
restore), not a claim about GPU memory.

Long tail: `generate` decodes prompts `micro_batch` at a time; while it runs,
`active_sequences()` is the number of prompts not finished yet (the server reports it in
`status`), and the result carries each sample's finish order and the per-step count of
unfinished sequences (`active_trace`). Sampling depends on the seed, a sequence's place
in the whole batch and the position only (`lm.uniforms`), so a batch split over
replicas, or a sequence continued elsewhere from its prefix (`Continuation`), samples as
one engine would.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from slurmrl.worker.lm import BOS, EOS, PAD, CharTokenizer, TinyLM, sample_micro_batch
from slurmrl.worker.protocol import (
    BackendError,
    Continuation,
    GenerateParams,
    GenerateResult,
    Role,
    Sample,
)
from slurmrl.worker.torch_backend import TorchModelBackend

MAX_PROMPTS = 4096


class TinyBackend(TorchModelBackend):
    """`TinyLM` on CPU as a rollout (generate) or a trainer (train_step)."""

    name = "tiny"

    def __init__(self, role: Role, lr: float = 3e-3, seed: int = 0, dim: int = 48) -> None:
        super().__init__(role, lambda: TinyLM(dim=dim), device="cpu", lr=lr, seed=seed)
        self.tokenizer = CharTokenizer()

    def generate(self, prompts: Sequence[str], params: GenerateParams,
                 cont: Continuation | None = None) -> GenerateResult:
        model, _ = self._ready("generate")
        assert isinstance(model, TinyLM)
        if not prompts:
            raise BackendError("generate needs at least one prompt")
        if len(prompts) > MAX_PROMPTS:
            raise BackendError(f"at most {MAX_PROMPTS} prompts per call, got {len(prompts)}")
        encoded = [self.tokenizer.encode(p) for p in prompts]
        if cont is None:
            indices = [params.first_index + k for k in range(len(prompts))]
            prefixes: list[tuple[int, ...]] = [()] * len(prompts)
        else:
            indices, prefixes = list(cont.indices), list(cont.prefixes)
            for k, head in enumerate(prefixes):
                bad = [t for t in head if t in (EOS, PAD, BOS) or t >= self.tokenizer.vocab_size]
                if bad:
                    raise BackendError(f"continuation.prefixes[{k}] has token(s) {bad} that "
                                       "end a completion or are outside the vocabulary")
        model.eval()
        mb = params.micro_batch
        results: list[tuple[list[int], str, int]] = []
        finish_order: list[tuple[int, int, int]] = []  # (global step, micro-batch, index)
        trace: list[int] = []
        self._active = len(prompts)
        try:
            with torch.no_grad():
                for start in range(0, len(prompts), mb):
                    chunk = encoded[start : start + mb]
                    pending_after = len(prompts) - start - len(chunk)
                    base = len(trace)

                    def on_step(unfinished: int, pending: int = pending_after) -> None:
                        self._active = unfinished + pending
                        trace.append(self._active)

                    outs = sample_micro_batch(model, chunk, params,
                                              indices[start : start + mb], on_step,
                                              prefixes[start : start + mb])
                    for i, (_, _, step) in enumerate(outs):
                        finish_order.append(
                            (base + step - len(prefixes[start + i]), start, i))
                    results.extend(outs)
        finally:
            self._active = 0
        rank = {start + i: r for r, (_, start, i) in enumerate(sorted(finish_order))}
        samples = tuple(
            Sample(
                prompt=prompts[k],
                completion=self.tokenizer.decode(ids),
                prompt_ids=encoded[k],
                completion_ids=tuple(ids),
                finish_reason=reason,
                finish_step=step,
                finish_rank=rank[k],
            )
            for k, (ids, reason, step) in enumerate(results)
        )
        return GenerateResult(samples=samples, active_trace=tuple(trace))
