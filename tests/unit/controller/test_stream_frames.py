"""Lease-stream frames: any text is parsed into a checked operation or refused with an
RpcError naming what is wrong — never another exception (that would drop the stream)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmrl.controller.stream import OPS, frame_id, parse_frame
from slurmrl.controller.validate import RpcError

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids,
                                                              max_size=6),
    max_leaves=12,
)
FIELDS = st.sampled_from(["id", "op", "job_id", "lease_id", "phase", "wait_s", "min_gpus",
                          "timing", "extra"])
FRAMEISH = st.dictionaries(FIELDS, JSON | st.sampled_from([*OPS, "rollout", "train"]),
                           max_size=7)


def _check(raw: str) -> None:
    try:
        op, b = parse_frame(raw)
    except RpcError as exc:
        assert 400 <= exc.status < 500 and exc.message
    else:
        assert op in OPS
        assert isinstance(b["id"], int) and isinstance(b["job_id"], int) and b["job_id"] >= 1
        assert set(b) <= set(OPS[op])
    fid = frame_id(raw)
    assert fid is None or (isinstance(fid, int) and fid >= 0)


@settings(max_examples=400, deadline=None)
@given(FRAMEISH)
def test_frame_shaped_objects_parse_or_are_refused(obj: dict[str, object]) -> None:
    _check(json.dumps(obj))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60) | JSON.map(json.dumps))
def test_any_text_parses_or_is_refused(raw: str) -> None:
    _check(raw)


def test_a_good_acquire_and_named_errors() -> None:
    op, b = parse_frame('{"id": 3, "op": "acquire", "job_id": 9, "phase": "rollout"}')
    assert op == "acquire" and b["phase"] == "rollout" and b["job_id"] == 9
    with pytest.raises(RpcError, match="job_id"):
        parse_frame('{"id": 3, "op": "heartbeat"}')
    with pytest.raises(RpcError, match="'op' must be one of"):
        parse_frame('{"id": 3, "op": "steal", "job_id": 9}')
    with pytest.raises(RpcError, match="phase"):
        parse_frame('{"id": 3, "op": "acquire", "job_id": 9, "phase": "nap"}')
    with pytest.raises(RpcError):
        parse_frame('{"id": true, "op": "heartbeat", "job_id": 9}')
    assert frame_id('{"id": 5, "op": "nope"}') == 5
    assert frame_id("not json") is None


def test_a_frame_nested_past_the_recursion_limit_is_refused_as_malformed() -> None:
    deep = '{"id": 4, "op": "heartbeat", "job_id": 9, "x": ' + "[" * 50_000
    with pytest.raises(RpcError, match="nested too deeply") as info:
        parse_frame(deep)
    assert info.value.status == 400
    assert frame_id(deep) is None
