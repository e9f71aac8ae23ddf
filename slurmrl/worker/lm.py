"""The tiny language model of the `tiny` backend, its tokenizer and the GRPO loss.

`TinyLM` is a real (if small) character-level GRU language model over the alphabet of
arithmetic prompts ("12+7="), so tests and the demo run real sampling and real
policy-gradient updates on a CPU in milliseconds. It is not meant to learn arithmetic
well; it is meant to make every path of a service (generate, train, park, sync) real.

`policy_gradient_loss` is the GRPO-style objective the `torch` and `tiny` trainers share:
any model mapping token ids [B, T] to logits [B, T, V] can use it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from slurmrl.worker.protocol import BackendError, GenerateParams, TrainSample

PAD, BOS, EOS = 0, 1, 2
#: temperatures below this sample greedily, as vLLM's do: dividing by a subnormal one
#: overflowed the logits, and every sequence ended at once
GREEDY_BELOW = 1e-5
ALPHABET = "0123456789+-*= "


class CharTokenizer:
    """Characters of `ALPHABET` to ids 3.., plus PAD/BOS/EOS."""

    vocab_size = 3 + len(ALPHABET)

    def encode(self, text: str) -> tuple[int, ...]:
        bad = sorted({c for c in text if c not in ALPHABET})
        if bad:
            raise BackendError(
                f"prompt {text!r} has character(s) {bad} outside the tiny vocabulary "
                f"{ALPHABET!r}"
            )
        return tuple(3 + ALPHABET.index(c) for c in text)

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(ALPHABET[i - 3] for i in ids if 3 <= i < self.vocab_size)


class TinyLM(nn.Module):
    """Embedding -> 2-layer GRU -> linear head; ~30k parameters with the defaults."""

    def __init__(self, vocab_size: int = CharTokenizer.vocab_size, dim: int = 48) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.gru = nn.GRU(dim, dim, num_layers=2, batch_first=True)
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(self.embed(ids))
        logits: torch.Tensor = self.head(out)
        return logits

    def step(
        self, ids: torch.Tensor, hidden: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits of the last position and the new hidden state, for incremental decoding."""
        out, hidden = self.gru(self.embed(ids), hidden)
        logits: torch.Tensor = self.head(out[:, -1])
        return logits, hidden


class WideLM(nn.Module):
    """Embedding -> `layers` square linear layers of width `dim` -> linear head.

    A model whose state is large enough to measure moving it (TinyLM's is 120 kB):
    `layers * dim**2` parameters and about as many again in Adam's two moments, so that
    parking it shows in NVML's and torch's memory readings and copies long enough to
    time (`benchmarks/park_cuda.py`, the `gpu` tests). Same interface as any trainer's
    model: token ids [B, T] to logits [B, T, V].
    """

    def __init__(self, dim: int = 1024, layers: int = 4,
                 vocab_size: int = CharTokenizer.vocab_size, dropout: float = 0.0) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.body = nn.Sequential(*(nn.Sequential(nn.Linear(dim, dim), nn.GELU(),
                                                  nn.Dropout(dropout))
                                    for _ in range(layers)))
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(self.body(self.embed(ids)))
        return logits


_MASK64 = (1 << 64) - 1


def _i64(c: int) -> int:
    """A Python int as the signed 64-bit integer with the same low 64 bits."""
    c &= _MASK64
    return c - (1 << 64) if c >= 1 << 63 else c


_GOLDEN, _M1, _M2 = _i64(0x9E3779B97F4A7C15), _i64(0xBF58476D1CE4E5B9), _i64(0x94D049BB133111EB)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (multiplication wraps; the shifts are made
    logical by masking)."""
    x = x ^ ((x >> 30) & ((1 << 34) - 1))
    x = x * _M1
    x = x ^ ((x >> 27) & ((1 << 37) - 1))
    x = x * _M2
    return x ^ ((x >> 31) & ((1 << 33) - 1))


def uniforms(seed: int, index: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """One uniform in (0, 1) per sequence [B] (float64) that depends only on (seed, the
    sequence's index in its batch, the completion position being sampled): a sequence
    samples the same tokens whichever call, micro-batch or replica decodes it, and
    wherever it was cut."""
    key = _mix(index * _GOLDEN + _i64(seed))
    bits = _mix(key + pos * _GOLDEN)
    return (((bits >> 11) & ((1 << 53) - 1)).double() + 0.5) / float(1 << 53)


def sample_micro_batch(
    model: TinyLM,
    prompt_ids: Sequence[tuple[int, ...]],
    params: GenerateParams,
    indices: Sequence[int],
    on_step: Callable[[int], None],
    prefixes: Sequence[tuple[int, ...]] | None = None,
) -> list[tuple[list[int], str, int]]:
    """Decode one micro-batch; returns (completion ids, finish reason, finish step) each.

    Completion ids end with the stop token when the finish reason is "stop". A sequence
    with a prefix (completion ids it already has) continues after it: its returned ids
    are the prefix and up to `max_tokens` new ones, its finish step counts from the
    prefix's start. Sampling depends on `params.seed`, the sequence's `indices[k]` and
    the position only (`uniforms`).

    `on_step(n_unfinished)` is called after every decode step of the micro-batch.
    Prompts are encoded one by one (they differ in length; a GRU has no padding mask),
    then decoded together.
    """
    n = len(prompt_ids)
    pre = [tuple(p) for p in prefixes] if prefixes is not None else [()] * n
    hiddens, last = [], []
    for ids, head in zip(prompt_ids, pre, strict=True):
        seq = torch.tensor([[BOS, *ids, *head]], dtype=torch.long)
        logits, h = model.step(seq, None)
        hiddens.append(h)
        last.append(logits)
    hidden = torch.cat(hiddens, dim=1)
    logits = torch.cat(last, dim=0)
    index = torch.tensor(list(indices), dtype=torch.int64)
    start = torch.tensor([len(h) for h in pre], dtype=torch.int64)
    outs: list[list[int]] = [list(h) for h in pre]
    done = [False] * n
    reason = ["length"] * n
    finish = [len(pre[i]) + params.max_tokens - 1 for i in range(n)]
    seed = params.seed * 1_000_003
    for step in range(params.max_tokens):
        if params.temperature < GREEDY_BELOW:
            tok = logits.argmax(dim=-1)
        else:
            # inverse-CDF sampling of softmax(logits / T) at a counter-based uniform
            probs = torch.softmax(logits.double() / params.temperature, dim=-1)
            cdf = probs.cumsum(dim=-1)
            u = uniforms(seed, index, start + step)[:, None] * cdf[:, -1:]
            tok = (cdf < u).sum(dim=-1).clamp(max=probs.shape[-1] - 1)
        for i in range(n):
            if done[i]:
                continue
            t = int(tok[i])
            # the stop token stays in the ids (as vLLM's do) so a trainer learns to stop;
            # PAD/BOS are never valid completion tokens and also end the sample
            outs[i].append(t)
            if t in (EOS, PAD, BOS):
                done[i], reason[i], finish[i] = True, "stop", len(pre[i]) + step
        if step == params.max_tokens - 1:
            done = [True] * n  # the rest end here by length
        on_step(n - sum(done))
        if all(done):
            break
        logits, hidden = model.step(tok.unsqueeze(1), hidden)
    return [(outs[i], reason[i], finish[i]) for i in range(n)]


def policy_gradient_loss(
    model: nn.Module, samples: Sequence[TrainSample], device: torch.device
) -> tuple[torch.Tensor, int]:
    """GRPO-style loss: -sum(advantage * log p(completion token)) / completion tokens.

    The sequence fed is BOS + prompt + completion; only completion positions count.
    Returns (loss, number of completion tokens).
    """
    vocab = _vocab_size(model)
    for i, s in enumerate(samples):  # named before the batch is padded together
        for field in ("prompt_ids", "completion_ids"):
            ids_of = getattr(s, field)
            bad = next((t for t in ids_of if t < 0 or (vocab is not None and t >= vocab)),
                       None)
            if bad is not None:
                top = "" if vocab is None else f"0..{vocab - 1}"
                raise BackendError(f"samples[{i}].{field} has token id {bad} outside the "
                                   f"model's vocabulary ({top or 'ids >= 0'})")
    seqs = [[BOS, *s.prompt_ids, *s.completion_ids] for s in samples]
    width = max(len(q) for q in seqs)
    ids = torch.full((len(seqs), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(seqs), width - 1))
    adv = torch.tensor([s.advantage for s in samples])
    for i, (q, s) in enumerate(zip(seqs, samples, strict=True)):
        ids[i, : len(q)] = torch.tensor(q)
        start = 1 + len(s.prompt_ids) - 1  # target index of the first completion token
        mask[i, start : start + len(s.completion_ids)] = 1.0
    ids, mask, adv = ids.to(device), mask.to(device), adv.to(device)
    logits = model(ids[:, :-1])
    logp = torch.log_softmax(logits.float(), dim=-1)
    tok_logp = logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    n_tokens = int(mask.sum())
    loss = -(adv.unsqueeze(1) * tok_logp * mask).sum() / max(n_tokens, 1)
    return loss, n_tokens


def _vocab_size(model: nn.Module) -> int | None:
    """Rows of the model's first embedding table: checked before a bad id crashes a GPU."""
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            return int(module.num_embeddings)
    return None
