"""The hand-off state file's raw layout: what it holds, and the damaged files it refuses.

The layout is documented in `slurmrl/worker/handoff.py`; `_edit` below rewrites a real
file by that description (magic, u64 header length, JSON header, padding to 64 bytes,
data), so a test damages exactly one thing and the rest stays valid.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from slurmrl.model import Residency
from slurmrl.worker.handoff import FORMAT, MAGIC, peek_generation, read_state, write_state
from slurmrl.worker.protocol import BackendError, GenerateParams, Role, TrainSample
from slurmrl.worker.tiny import TinyBackend


def _split(raw: bytes) -> tuple[dict[str, Any], bytes]:
    """A state file's header (parsed) and data section."""
    assert raw.startswith(MAGIC)
    (length,) = struct.unpack_from("<Q", raw, len(MAGIC))
    start = len(MAGIC) + 8 + length
    return json.loads(raw[len(MAGIC) + 8 : start]), raw[start + (-start % 64) :]


def _join(header: dict[str, Any] | bytes, data: bytes) -> bytes:
    blob = header if isinstance(header, bytes) else json.dumps(header).encode()
    head = MAGIC + struct.pack("<Q", len(blob)) + blob
    return head + bytes(-len(head) % 64) + data


def _edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    header, data = _split(path.read_bytes())
    change(header)
    path.write_bytes(_join(header, data))


def _entry(header: dict[str, Any], *key: str | int) -> dict[str, Any]:
    return next(e for e in header["tensors"] if e["key"] == list(key))


def _batch() -> list[TrainSample]:
    roll = TinyBackend(Role.ROLLOUT)
    roll.load()
    samples = roll.generate(["1+2=", "30*4="], GenerateParams(max_tokens=8, seed=1)).samples
    return [s.with_advantage(a) for s, a in zip(samples, (1.0, -0.5), strict=True)]


def _trainer() -> TinyBackend:
    b = TinyBackend(Role.TRAINER, lr=1e-2, seed=3)
    b.load()
    b.train_step(_batch())  # Adam's moments and step exist
    return b


def _params(b: TinyBackend) -> list[torch.Tensor]:
    assert b._model is not None
    return [p.detach().clone() for p in b._model.parameters()]


# --- the layout and what it round-trips -------------------------------------------------


def test_a_state_round_trips_exactly(tmp_path: Path) -> None:
    path = tmp_path / "x.state"
    strided = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # not contiguous
    state = {
        "floats": [0.1, -0.0, math.inf, -math.inf, math.nan, 1e-308],
        "ints": [0, -7, 2**70], "flags": (True, False, None), "text": "ünï\n\"$",
        "groups": [{"lr": 0.01, "betas": (0.9, 0.999), "params": [0, 1]}],
        "by_index": {0: {"step": torch.tensor(3.0)}, 5: {"step": 2}},
        "$odd": {"$tensor": 1, "plain": 2},  # keys like the format's tags
        "tensors": {"strided": strided, "bf16": torch.randn(5).to(torch.bfloat16),
                    "bool": torch.tensor([True, False, True]),
                    "i64": torch.tensor([-(2**62), 2**62]),
                    "empty": torch.empty(0, 3), "scalar": torch.tensor(7, dtype=torch.int8)},
    }
    assert write_state(path, state, 4)

    got = read_state(path)
    assert (got["format"], got["generation"]) == (FORMAT, 4)
    assert got["ints"] == [0, -7, 2**70] and got["flags"] == (True, False, None)
    assert got["text"] == state["text"] and got["$odd"] == state["$odd"]
    floats = got["floats"]
    assert floats[:4] == [0.1, -0.0, math.inf, -math.inf] and math.copysign(1, floats[1]) < 0
    assert math.isnan(floats[4]) and floats[5] == 1e-308
    assert got["groups"] == state["groups"] and isinstance(got["groups"][0]["betas"], tuple)
    assert list(got["by_index"]) == [0, 5] and got["by_index"][5] == {"step": 2}
    assert torch.equal(got["by_index"][0]["step"], torch.tensor(3.0))
    for name, want in state["tensors"].items():
        have = got["tensors"][name]
        assert have.dtype == want.dtype and have.shape == want.shape, name
        assert torch.equal(have, want), name
    # the views are of a private mapping: writing to one does not change the file
    got["tensors"]["strided"].fill_(-1)
    assert torch.equal(read_state(path)["tensors"]["strided"], strided)


def test_the_file_is_a_json_header_and_raw_bytes(tmp_path: Path) -> None:
    path = tmp_path / "x.state"
    weights = torch.randn(4, 3)
    write_state(path, {"role": "trainer", "model": {"w": weights},
                       "optimizer": {"state": {0: {"step": torch.tensor(2.0)}}}}, 1)
    header, data = _split(path.read_bytes())
    assert {k: header[k] for k in ("format", "generation", "byteorder")} == \
        {"format": FORMAT, "generation": 1, "byteorder": "little"}
    assert header["state"]["role"] == "trainer"
    assert header["state"]["optimizer"] == {"state": {"$dict": [[0, {"step": {"$tensor": 1}}]]}}
    w, step = header["tensors"]
    assert w == {"key": ["model", "w"], "dtype": "float32", "shape": [4, 3], "offset": 0,
                 "nbytes": 48}
    assert step["key"] == ["optimizer", "state", 0, "step"] and step["offset"] == 64
    assert len(data) == header["data_bytes"] == 68
    raw = np.frombuffer(data, dtype=np.float32, count=12, offset=0).reshape(4, 3)
    assert np.array_equal(raw, weights.numpy())
    assert np.frombuffer(data, dtype=np.float32, count=1, offset=64)[0] == 2.0


@pytest.mark.parametrize("value", [{1, 2}, torch.ones(2).to_sparse(), object(),
                                   {(1, 2): 3}, torch.empty(2, device="meta"),
                                   torch.ones(2, dtype=torch.float64).view(torch.uint1)],
                         ids=["set", "sparse", "object", "tuple key", "meta", "uint1"])
def test_a_value_the_format_cannot_hold_writes_nothing(tmp_path: Path, value: Any) -> None:
    path = tmp_path / "x.state"
    write_state(path, {"n": 1}, 1)
    kept = path.read_bytes()
    with pytest.raises(BackendError,
                       match=r"cannot write the handoff state.*(cannot hold|holds dense)"):
        write_state(path, {"model": {"w": value}}, 2)
    assert path.read_bytes() == kept
    assert [p.name for p in tmp_path.iterdir()] == ["x.state"]


# --- damaged files: refused with a clear error -------------------------------------------


def _set(*keys: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(header: dict[str, Any]) -> None:
        target = header
        for k in keys[:-1]:
            target = target[k]
        target[keys[-1]] = value
    return change


def _extra_entry(header: dict[str, Any]) -> None:
    header["tensors"].append({**header["tensors"][0], "key": ["nowhere"]})


def _swap_keys(header: dict[str, Any]) -> None:
    first, second = header["tensors"][:2]
    first["key"], second["key"] = second["key"], first["key"]


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "header not JSON": (lambda p: p.write_bytes(_join(b"{not json", _split(p.read_bytes())[1])),
                        "corrupt: its header is not JSON"),
    "header not valid UTF-8": (lambda p: p.write_bytes(_join(b'{"\xff": 1}', b"")),
                               "corrupt: its header is not JSON"),
    "a key repeated": (lambda p: p.write_bytes(_join(b'{"format": 1, "format": 2}', b"")),
                       "corrupt: its header is not JSON .a key is repeated"),
    "unknown format version": (lambda p: _edit(p, _set("format", value="slurmrl-handoff/3")),
                               "is 'slurmrl-handoff/3', not a slurmrl-handoff/2 state file"),
    "the torch.save format": (lambda p: torch.save({"format": "slurmrl-handoff/1",
                                                    "generation": 1}, p),
                              "not a slurmrl-handoff/2 state file"),
    "empty": (lambda p: p.write_bytes(b""), "not a slurmrl-handoff/2 state file"),
    "truncated in the header": (lambda p: p.write_bytes(p.read_bytes()[:40]),
                                "corrupt: truncated in its header"),
    "truncated in the data": (lambda p: p.write_bytes(p.read_bytes()[:-1]),
                              "corrupt or truncated: .* its header accounts for"),
    "bytes past the data": (lambda p: p.write_bytes(p.read_bytes() + b"\0"),
                            "corrupt or truncated"),
    "no generation": (lambda p: _edit(p, _set("generation", value=-1)),
                      "no valid generation: -1"),
    "other byte order": (lambda p: _edit(p, _set("byteorder", value="big")),
                         "written big-endian"),
    "offset past the end": (lambda p: _edit(p, lambda h: h["tensors"][-1].update(
        offset=h["data_bytes"] // 64 * 64 + 64)), "runs past the end of the data"),
    "offset unaligned": (lambda p: _edit(p, _set("tensors", 0, "offset", value=4)),
                         "no valid offset"),
    "length not its shape's": (lambda p: _edit(p, _set("tensors", 0, "nbytes", value=8)),
                               "has 8 bytes; float32 of shape"),
    "unknown dtype": (lambda p: _edit(p, _set("tensors", 0, "dtype", value="object")),
                      "unknown dtype 'object'"),
    "entry malformed": (lambda p: _edit(p, _set("tensors", 0, "key", value=[])),
                        "tensor entry 0 has no valid key"),
    "keys swapped": (lambda p: _edit(p, _swap_keys), "whose key is"),
    "a tensor not in the state": (lambda p: _edit(p, _extra_entry),
                                  r"tensors \['nowhere'\] are not in its state"),
    # refused at a depth of its own: at 600 levels Python 3.12 (inlined comprehensions)
    # decoded what 3.11 ran out of recursion on, and the refusal said something else
    "nested too deeply": (lambda p: p.write_bytes(_join(
        b'{"format": "slurmrl-handoff/2", "generation": 1, "byteorder": "little", '
        b'"data_bytes": 0, "tensors": [], "state": {"x": ' + b"[" * 300 + b"]" * 300 + b"}}",
        b"")), r"corrupt: its state is nested too deeply \(over 64 levels\)"),
    "an unknown tag": (lambda p: _edit(p, _set("state", "steps", value={"$set": [1]})),
                       "steps is an unknown \\$set"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_file_is_refused_and_the_copy_keeps_its_state(
    tmp_path: Path, damage: str
) -> None:
    path = tmp_path / "trainer.state"
    _trainer().hand_off(path)
    do, message = DAMAGE[damage]
    do(path)
    with pytest.raises(BackendError, match=message):
        read_state(path)
    _refused_changes_nothing(_trainer(), path, message)


def test_peek_reads_the_header_alone_and_refuses_a_foreign_file(tmp_path: Path) -> None:
    path = tmp_path / "trainer.state"
    assert peek_generation(path) is None
    _trainer().hand_off(path)
    _edit(path, _extra_entry)  # a damaged tensor table: take_over refuses it, peek need not
    assert peek_generation(path) == 1
    path.write_bytes(b"PK\x03\x04 a zip")
    with pytest.raises(BackendError, match="not a slurmrl-handoff/2 state file"):
        peek_generation(path)


# --- files that are well formed but do not fit the model ----------------------------------


def _refused_changes_nothing(b: TinyBackend, path: Path, message: str) -> None:
    before = (_params(b), b.steps, b.weights_version, b.generation, b.residency)
    with pytest.raises(BackendError, match=message):
        b.take_over(path)
    assert all(torch.equal(x, y) for x, y in zip(_params(b), before[0], strict=True))
    assert (b.steps, b.weights_version, b.generation, b.residency) == before[1:]
    b.train_step(_batch())  # still a working trainer


def _ghost(header: dict[str, Any]) -> None:
    """A tensor `ghost.weight` in the model's state, sharing embed.weight's bytes."""
    header["tensors"].append({**_entry(header, "model", "embed.weight"),
                              "key": ["model", "ghost.weight"]})
    header["state"]["model"]["ghost.weight"] = {"$tensor": len(header["tensors"]) - 1}


def _retype(*key: str | int) -> Callable[[dict[str, Any]], None]:
    return lambda header: _entry(header, *key).update(dtype="int32")  # float32's size


@pytest.mark.parametrize(("change", "message"), [
    (_ghost, r"does not fit this model: missing keys \[\], unexpected keys \['ghost.weight'\]"),
    (_retype("model", "embed.weight"),
     "embed.weight has dtype torch.int32, the model's is torch.float32"),
    (_retype("optimizer", "state", 0, "exp_avg"),
     "optimizer state exp_avg of parameter 0 has dtype torch.int32, the parameter's is "
     "torch.float32"),
], ids=["a tensor the model lacks", "wrong dtype", "wrong moment dtype"])
def test_take_over_refuses_tensors_that_do_not_fit(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], message: str
) -> None:
    path = tmp_path / "trainer.state"
    _trainer().hand_off(path)
    _edit(path, change)
    _refused_changes_nothing(_trainer(), path, message)
    # a handed-off copy refused the same way holds nothing and stays handed off
    gone = _trainer()
    gone.hand_off(tmp_path / "own.state")
    with pytest.raises(BackendError, match=message):
        gone.take_over(path)
    assert gone.handed_off and gone.residency is Residency.PARKED


@pytest.mark.parametrize("keep", [0.5, 0.99], ids=["half", "all but the tail"])
def test_take_over_refuses_a_truncated_file(tmp_path: Path, keep: float) -> None:
    path = tmp_path / "trainer.state"
    _trainer().hand_off(path)
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * keep)])
    _refused_changes_nothing(_trainer(), path, "corrupt or truncated")
