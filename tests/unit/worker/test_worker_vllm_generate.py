"""The vllm backend's `generate` with a `Continuation`, against a FAKE engine and a FAKE
`vllm` module (no GPU, no vLLM here): what the backend sends the engine and how it
assembles the samples. Nothing here shows vLLM itself behaves."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from slurmrl.model import Residency
from slurmrl.worker.protocol import BackendError, Continuation, GenerateParams
from slurmrl.worker.vllm_backend import VllmBackend


class SamplingParams:
    def __init__(self, **kw: Any) -> None:
        self.kw = kw


EOS = 2


class Tokenizer:
    """One id per character: 100 + its code point; `EOS` is a special token, decoded
    unless skipped (Hugging Face's default: `skip_special_tokens=False`)."""

    def encode(self, text: str) -> list[int]:
        return [100 + ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join("</s>" if i == EOS else chr(i - 100) for i in ids
                       if not (skip_special_tokens and i == EOS))


class FakeEngine:
    """Answers each prompt with 'xy' (finish 'stop'), recording what it was sent;
    `eos`: its token ids end with the EOS, as vLLM's do (its text has none)."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, dict[str, Any]]] = []
        self.eos = False

    def get_tokenizer(self) -> Tokenizer:
        return Tokenizer()

    def generate(self, inputs: list[Any], sps: list[SamplingParams],
                 use_tqdm: bool = False) -> list[Any]:
        outs = []
        for prompt, sp in zip(inputs, sps, strict=True):
            self.sent.append((prompt, sp.kw))
            ids = (prompt["prompt_token_ids"] if isinstance(prompt, dict)
                   else Tokenizer().encode(prompt))
            tail = [EOS] if self.eos else []
            comp = types.SimpleNamespace(token_ids=Tokenizer().encode("xy") + tail,
                                         text="xy", finish_reason="stop")
            outs.append(types.SimpleNamespace(prompt=None, prompt_token_ids=ids,
                                              outputs=[comp]))
        return outs


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> tuple[VllmBackend, FakeEngine]:
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(
        SamplingParams=SamplingParams))
    b = VllmBackend("Qwen/Qwen3-0.6B")
    engine = FakeEngine()
    b._llm, b._residency, b._weights_valid = engine, Residency.ACTIVE, True
    return b, engine


def test_a_continued_sequence_is_sent_as_prompt_and_prefix_ids_seeded_by_its_index(
        backend: tuple[VllmBackend, FakeEngine]) -> None:
    b, engine = backend
    tok = Tokenizer()
    head = tuple(tok.encode("ab"))
    out = b.generate(["1+1=", "2+2="], GenerateParams(max_tokens=5, seed=3, micro_batch=2),
                     Continuation((9, 4), (head, ())))
    (p0, kw0), (p1, kw1) = engine.sent
    assert p0 == {"prompt_token_ids": tok.encode("1+1=") + list(head)}
    assert p1 == {"prompt_token_ids": tok.encode("2+2=")}
    assert (kw0["seed"], kw1["seed"]) == (3 * 1_000_003 + 9, 3 * 1_000_003 + 4)
    assert kw0["max_tokens"] == 5
    s0, s1 = out.samples
    # the sample is the whole sequence: the prompt's ids, the prefix and the new tokens
    assert s0.prompt == "1+1=" and s0.prompt_ids == tuple(tok.encode("1+1="))
    assert s0.completion_ids == (*head, *tok.encode("xy")) and s0.completion == "abxy"
    assert s1.completion_ids == tuple(tok.encode("xy")) and s1.completion == "xy"


def test_without_a_continuation_prompts_go_as_text_seeded_by_first_index(
        backend: tuple[VllmBackend, FakeEngine]) -> None:
    b, engine = backend
    b.generate(["1+1=", "2+2="], GenerateParams(seed=3, micro_batch=1, first_index=6))
    assert [p for p, _ in engine.sent] == ["1+1=", "2+2="]
    assert [kw["seed"] for _, kw in engine.sent] == [3 * 1_000_003 + 6, 3 * 1_000_003 + 7]


def test_a_continued_sequence_reads_as_a_fresh_one_without_special_tokens(
        backend: tuple[VllmBackend, FakeEngine]) -> None:
    b, engine = backend
    engine.eos = True
    head = tuple(Tokenizer().encode("ab"))
    fresh, cont = b.generate(["1+1=", "2+2="], GenerateParams(),
                             Continuation((0, 1), ((), head))).samples
    assert fresh.completion == "xy"  # vLLM's text
    assert cont.completion == "abxy" and cont.completion_ids[-1] == EOS


def test_a_request_vllm_refuses_is_a_backend_error(
        backend: tuple[VllmBackend, FakeEngine], monkeypatch: pytest.MonkeyPatch) -> None:
    b, engine = backend

    def refuses(*args: Any, **kw: Any) -> list[Any]:
        # VLLMValidationError is a ValueError (vllm/exceptions.py)
        raise ValueError("The decoder prompt (length 5000) is longer than the maximum "
                         "model length of 4096.")

    monkeypatch.setattr(engine, "generate", refuses)
    with pytest.raises(BackendError, match=r"vLLM refused the request: The decoder prompt"):
        b.generate(["1+1="], GenerateParams())
    assert b.active_sequences() == 0
