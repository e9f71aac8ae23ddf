"""Parsing of what drivers send: bad input names the field."""

from __future__ import annotations

import time
from typing import Any

import pytest

from slurmrl.worker.protocol import (
    MAX_SEED,
    BackendError,
    Continuation,
    GenerateParams,
    Role,
    TrainSample,
    sequence_seed,
)


def test_generate_params_parse_and_defaults() -> None:
    p = GenerateParams.from_json({"max_tokens": 4, "temperature": 0, "seed": 3})
    assert p == GenerateParams(max_tokens=4, temperature=0.0, seed=3)


def test_seeds_up_to_63_bits_sample_on_tiny_and_derive_64_bit_sequence_seeds() -> None:
    # both backends take the same seeds: tiny samples with the largest one, and every
    # sequence's seed (what vllm passes vLLM) stays within signed 64 bits
    from slurmrl.worker.tiny import TinyBackend

    b = TinyBackend(Role.ROLLOUT)
    b.load()
    for seed in (MAX_SEED, time.time_ns()):
        assert len(b.generate(["1+2="], GenerateParams(max_tokens=3, seed=seed)).samples) == 1
        assert 0 <= sequence_seed(seed, 2**31) <= MAX_SEED


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be in"),
        ({"temperature": -1.0}, "temperature must be in"),
        ({"temperature": 2.5}, r"temperature must be in 0\.\.2"),  # vLLM takes no more
        ({"seed": -1}, r"seed must be in 0\.\.2\*\*63-1"),
        ({"seed": 2**63}, r"seed must be in 0\.\.2\*\*63-1"),
        ({"micro_batch": 0}, "micro_batch must be"),
        ({"top_k": 3}, r"unknown generate param\(s\) \['top_k'\]"),
        ({"seed": "1"}, "'seed' has the wrong type"),
        ({"max_tokens": True}, "'max_tokens' has the wrong type"),
        # JSON reads integers of any size: float() of one this large overflows
        ({"temperature": 10**400}, r"temperature must be in 0\.\.2, got an integer too "
         "large for a float"),
    ],
)
def test_generate_params_errors(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(BackendError, match=message):
        GenerateParams.from_json(raw)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("x", r"samples\[0\] must be an object"),
        ({"prompt_ids": [1], "completion_ids": [2], "advantage": 1, "extra": 1}, "unknown key"),
        ({"prompt_ids": "12", "completion_ids": [2], "advantage": 1}, "prompt_ids must be"),
        ({"prompt_ids": [1], "completion_ids": [], "advantage": 1}, "completion_ids is empty"),
        ({"prompt_ids": [1], "completion_ids": [2.5], "advantage": 1}, "completion_ids must"),
        ({"prompt_ids": [1], "completion_ids": [2], "advantage": "high"}, "advantage must be"),
        # json.loads reads NaN and Infinity: one such step poisons the resident weights
        ({"prompt_ids": [1], "completion_ids": [2], "advantage": float("nan")},
         "advantage must be finite, got nan"),
        ({"prompt_ids": [1], "completion_ids": [2], "advantage": float("-inf")},
         "advantage must be finite, got -inf"),
        ({"prompt_ids": [1], "completion_ids": [2], "advantage": -(10**400)},
         r"samples\[0\]\.advantage must be finite, got an integer too large for a float"),
        # a token id a torch tensor cannot hold (2**64), or none at all (-1)
        ({"prompt_ids": [2**64], "completion_ids": [2], "advantage": 1},
         r"samples\[0\]\.prompt_ids must be a list of token ids \(integers in 0\.\.2\*\*63-1\)"),
        ({"prompt_ids": [1], "completion_ids": [2, 2**63], "advantage": 1},
         r"samples\[0\]\.completion_ids must be a list of token ids"),
        ({"prompt_ids": [-1], "completion_ids": [2], "advantage": 1},
         r"samples\[0\]\.prompt_ids must be a list of token ids"),
    ],
)
def test_train_sample_errors(raw: Any, message: str) -> None:
    with pytest.raises(BackendError, match=message):
        TrainSample.from_json(raw, 0)


def test_train_sample_round_trip() -> None:
    s = TrainSample((4, 5), (6, 2), -0.25)
    assert TrainSample.from_json(s.to_json(), 0) == s


def test_continuation_prefixes_hold_token_ids_a_tensor_holds() -> None:
    assert Continuation.from_json({"indices": [0], "prefixes": [[2**63 - 1]]}, 1)
    with pytest.raises(BackendError, match=r"prefixes\[0\] must be a list of at most "
                       r"\d+ token ids \(integers in 0\.\.2\*\*63-1\)"):
        Continuation.from_json({"indices": [0], "prefixes": [[4, 2**64]]}, 1)
