"""The shrink body: `keep` (how many GPUs) or `gpus` (which job-local ones), and the grow and pack
bodies (`gpus`), checked before anything changes; every malformed body is an RpcError naming the
field."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmrl.controller.validate import GROW, PACK, SHRINK, RpcError, fields


def test_keep_or_gpus_parse() -> None:
    assert fields({"keep": 2}, SHRINK) == {"keep": 2, "gpus": None}
    assert fields({"gpus": [3, 1]}, SHRINK) == {"keep": None, "gpus": [3, 1]}


@pytest.mark.parametrize(("body", "says"), [
    ({"gpus": []}, "'gpus' must have 1 to"),
    ({"gpus": [1, 1]}, "'gpus' lists an entry twice"),
    ({"gpus": [-1]}, "'gpus' must be between 0 and 1023"),
    ({"gpus": [True]}, "'gpus' must be a list of integers, got a boolean"),
    ({"gpus": "0,1"}, "'gpus' must be a list of integers, got a string"),
    ({"gpus": [0.5]}, "'gpus' must be a list of integers, got a number"),
    ({"keep": 0}, "'keep' must be between 1 and 1024"),
    ({"keep": 1, "gpu": [0]}, "unknown field"),
])
def test_malformed_shrink_bodies_are_refused_by_name(body: dict[str, object], says: str
                                                     ) -> None:
    with pytest.raises(RpcError, match=says) as err:
        fields(body, SHRINK)
    assert err.value.status == 400


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-5, 2000) | st.booleans() | st.floats() | st.text(max_size=3),
                max_size=70))
def test_any_gpu_list_parses_or_is_refused(gpus: list[object]) -> None:
    try:
        got = fields({"gpus": gpus}, SHRINK)["gpus"]
    except RpcError as exc:
        assert exc.status == 400 and "'gpus'" in exc.message
    else:
        assert got == gpus and 1 <= len(got) <= 64 and len(set(got)) == len(got)
        assert all(type(g) is int and 0 <= g <= 1023 for g in got)


@pytest.mark.parametrize(("body", "says"), [
    ({}, "'gpus' is required"),
    ({"gpus": []}, "'gpus' must have 1 to"),
    ({"gpus": [2, 2]}, "'gpus' lists an entry twice"),
    ({"gpus": [1024]}, "'gpus' must be between 0 and 1023"),
    ({"gpus": [0], "keep": 1}, "unknown field"),
])
@pytest.mark.parametrize("schema", [GROW, PACK], ids=["grow", "pack"])
def test_malformed_grow_and_pack_bodies_are_refused_by_name(
        body: dict[str, object], says: str, schema: dict[str, object]) -> None:
    got = fields({"gpus": [2, 3]}, schema)  # type: ignore[arg-type]
    assert got["gpus"] == [2, 3] and all(v is None for k, v in got.items() if k != "gpus")
    with pytest.raises(RpcError, match=says) as err:
        fields(body, schema)  # type: ignore[arg-type]
    assert err.value.status == 400


@pytest.mark.parametrize(("held", "says"), [
    ("0,1", "'held' must be a list"),
    ([1, 1], "'held' lists an entry twice"),
    ([-1], "'held' must be between 0 and"),
])
def test_a_packs_malformed_held_is_refused_by_name(held: object, says: str) -> None:
    assert fields({"gpus": [0], "held": [4, 5]}, PACK) == {"gpus": [0], "held": [4, 5]}
    with pytest.raises(RpcError, match=says) as err:
        fields({"gpus": [0], "held": held}, PACK)
    assert err.value.status == 400
