"""The Python directive parser against the shared case table (tests/data/directives.toml).

The same table drives tests/integration/test_spank.py through the real plugin and sbatch,
so a wording or rule that drifts between C and Python fails one of the two.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from slurmrl.directives import (
    OPTION_ENV,
    DirectiveError,
    parse_env,
    parse_env_full,
    parse_mem,
    parse_options,
    parse_profile,
    parse_steps,
)
from slurmrl.model import Layout, Mux, Phase

CASES: dict[str, Any] = tomllib.loads(
    (Path(__file__).parents[1] / "data" / "directives.toml").read_text()
)
VALID = CASES["valid"]
INVALID = CASES["invalid"]


def test_table_covers_every_option_with_many_invalid_values() -> None:
    assert len(INVALID) >= 25
    at_fault = {next(iter(case["options"])) if len(case["options"]) == 1
                else list(case["options"])[-1] for case in INVALID}
    assert set(OPTION_ENV) <= at_fault


@pytest.mark.parametrize("case", INVALID, ids=lambda c: "|".join(c["options"].values())[:40])
def test_malformed_directive_is_rejected_with_the_plugins_message(case: dict[str, Any]) -> None:
    with pytest.raises(DirectiveError) as info:
        parse_options(case["options"])
    assert case["message"] in str(info.value)


@pytest.mark.parametrize("case", VALID, ids=lambda c: c["name"])
def test_valid_options_and_their_exported_env_parse_to_the_same_request(
    case: dict[str, Any],
) -> None:
    from_options = parse_options(case["options"])
    from_env = parse_env(case["env"])
    assert from_options == from_env
    assert from_env.gpus == int(case["env"]["SLURMRL_GPUS"])
    if "SLURMRL_MEM" in case["env"]:
        assert from_env.mem_bytes == int(case["env"]["SLURMRL_MEM"])


def test_everything_case_fills_every_field() -> None:
    req = parse_options(VALID[1]["options"])
    assert req.model == "Qwen/Qwen2.5-0.5B-Instruct"
    assert req.mem_bytes == 20 * 2**30
    assert req.mux is Mux.ON
    assert req.group == "team_a.exp-1"
    assert req.max_slowdown == 1.3
    assert req.layout is Layout.DISAGGREGATED and req.rollout_gpus == 1
    assert req.gpu_sets() == {"rollout": (0,), "trainer": (1, 2, 3)}
    assert req.profile is not None and req.profile.step_s == 60.0
    assert req.profile.share(Phase.REWARD) == 0.2
    assert req.steps == 500


def test_a_gpu_type_is_the_part_before_the_count() -> None:
    req = parse_options({"rl-gpus": "a100:4"})
    assert (req.gpus, req.gpu_type) == (4, "a100")
    assert parse_options({"rl-gpus": "4"}).gpu_type is None
    assert parse_env({"SLURMRL_GPUS": "4", "SLURMRL_GPU_TYPE": "a100"}) == req


def test_defaults_when_only_gpus_is_given() -> None:
    req = parse_env({"SLURMRL_GPUS": "2"})
    assert (req.model, req.mux, req.layout, req.rollout_gpus, req.steps) == (
        "tiny", Mux.AUTO, Layout.COLOCATED, None, None)


@pytest.mark.parametrize(("value", "expected"), [
    ("1", 1), ("500", 500), ("0500", 500), ("10000000", 10_000_000),
])
def test_steps_is_a_whole_number_up_to_ten_million(value: str, expected: int) -> None:
    assert parse_steps(value) == expected
    assert parse_options({"rl-gpus": "1", "rl-steps": value}).steps == expected


def test_disaggregated_default_split_is_half_the_gpus() -> None:
    assert parse_options({"rl-gpus": "6", "rl-layout": "disaggregated"}).rollout_gpus == 3


@pytest.mark.parametrize(("value", "expected"), [
    ("1", 2**20), ("1K", 1024), ("3m", 3 * 2**20), ("2G", 2 * 2**30), ("1T", 2**40),
])
def test_mem_units_are_binary_and_default_to_mebibytes(value: str, expected: int) -> None:
    assert parse_mem(value) == expected


def test_the_kelvin_sign_is_no_unit_as_the_plugin_says() -> None:
    # "\u212a".lower() == "k", but the plugin compares bytes and refuses --rl-mem=4\u212a
    with pytest.raises(DirectiveError, match=r"--rl-mem=4\?\?\?: expected a positive size"):
        parse_options({"rl-gpus": "4", "rl-mem": "4\u212a"})


def test_profile_keeps_shares_in_the_order_written() -> None:
    prior = parse_profile("train=0.6,rollout=0.4")
    assert prior.shares == ((Phase.TRAIN, 0.6), (Phase.ROLLOUT, 0.4))
    assert prior.step_s is None


def test_env_of_a_non_rl_job_is_refused() -> None:
    with pytest.raises(DirectiveError, match="SLURMRL_GPUS is not set"):
        parse_env({"PATH": "/bin"})


@pytest.mark.parametrize(("env", "fragment"), [
    ({"SLURMRL_GPUS": "x"}, "job environment: --rl-gpus=x"),
    ({"SLURMRL_GPUS": "2", "SLURMRL_MEM": "20G"}, "SLURMRL_MEM=20G: expected a positive number"),
    ({"SLURMRL_GPUS": "2", "SLURMRL_LAYOUT": "disaggregated", "SLURMRL_ROLLOUT_GPUS": "2"},
     "expected 1 <= R < --rl-gpus=2"),
    ({"SLURMRL_GPUS": "2", "SLURMRL_ROLLOUT_GPUS": "abc"}, "SLURMRL_ROLLOUT_GPUS=abc"),
    ({"SLURMRL_GPUS": "2", "SLURMRL_STEPS": "0"},
     "job environment: --rl-steps=0: expected a whole number 1..10000000"),
    ({"SLURMRL_GPUS": "2", "SLURMRL_GPU_TYPE": "h100;rm"},
     "job environment: SLURMRL_GPU_TYPE=h100;rm: expected a GPU type"),
])
def test_forged_environment_is_revalidated(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(DirectiveError) as info:
        parse_env(env)
    assert fragment in str(info.value)


def test_controller_url_comes_from_the_env() -> None:
    d = parse_env_full({"SLURMRL_GPUS": "1", "SLURMRL_CONTROLLER": "http://127.0.0.1:6829"})
    assert d.controller == "http://127.0.0.1:6829"


def test_unknown_option_is_named() -> None:
    with pytest.raises(DirectiveError, match="--rl-gpu: unknown option"):
        parse_options({"rl-gpu": "2"})


def test_directive_error_is_a_value_error() -> None:
    assert issubclass(DirectiveError, ValueError)
