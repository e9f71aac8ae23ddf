"""The vllm backend's weight loads, against a FAKE engine (no GPU, no vLLM here).

vLLM's engine core runs in a child process, and `collective_rpc`'s arguments reach it
through msgpack (vllm/v1/serial_utils.py), which takes no bytes object of 2**32 or more:
a weights blob of 4 GiB or more (any real model in fp32) cannot go as bytes. The fake
engine refuses bytes arguments outright and checks what it gets instead: the path of a
file only this user can read, removed after the load. vLLM's `load_weights` copies
tensor by tensor, so a load that fails midway leaves the model partly replaced: these
check that the backend then says so and refuses to generate. Nothing here shows vLLM
itself behaves so.
"""

from __future__ import annotations

import io
import os
import stat
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from slurmrl.model import Residency
from slurmrl.worker.protocol import BackendError, GenerateParams, NotReady
from slurmrl.worker.vllm_backend import VllmBackend, WeightSyncExtension


def _blob() -> bytes:
    buf = io.BytesIO()
    torch.save({"model.embed_tokens.weight": torch.arange(8.0).reshape(4, 2)}, buf)
    return buf.getvalue()


class FakeEngine:
    """`vllm.LLM` as far as a weight load goes; `refuse` makes its workers' load fail."""

    def __init__(self, refuse: Exception | None = None) -> None:
        self.refuse = refuse
        self.paths: list[Path] = []

    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        assert method == "slurmrl_load_weights"
        if any(isinstance(a, bytes | bytearray | memoryview) for a in args):
            # msgspec: "Can't encode bytes-like objects longer than 2**32 - 1"
            raise TypeError("bytes-like objects longer than 2**32 - 1 cannot be encoded")
        (path,) = args
        self.paths.append(Path(path))
        if self.refuse is not None:
            raise self.refuse
        return [1]

    def sleep(self, level: int) -> None:
        pass

    def wake_up(self, tags: list[str] | None = None) -> None:
        pass

    def reset_prefix_cache(self) -> None:
        pass


@pytest.fixture(autouse=True)
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(SamplingParams=dict))


def _backend(engine: FakeEngine) -> VllmBackend:
    b = VllmBackend("Qwen/Qwen3-0.6B")
    b._llm, b._residency, b._weights_valid = engine, Residency.ACTIVE, True
    return b


def test_weights_reach_the_engine_as_a_private_file_removed_after_the_load() -> None:
    seen: dict[str, Any] = {}

    class Checks(FakeEngine):
        def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
            out = super().collective_rpc(method, args)
            path = self.paths[-1]
            seen.update(data=path.read_bytes(), mode=stat.S_IMODE(path.stat().st_mode),
                        dir_mode=stat.S_IMODE(path.parent.stat().st_mode),
                        uid=path.stat().st_uid)
            return out

    engine = Checks()
    _backend(engine).import_weights(_blob())
    (path,) = engine.paths
    assert seen == {"data": _blob(), "mode": 0o600, "dir_mode": 0o700, "uid": os.geteuid()}
    if os.path.isdir("/dev/shm"):
        assert path.parent.parent == Path("/dev/shm")  # host memory, not a disk
    assert not path.exists() and not path.parent.exists()


def test_the_worker_extension_maps_the_file_it_is_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "weights.pt"
    path.write_bytes(_blob())
    loads: list[dict[str, Any]] = []
    real_load = torch.load

    def spy(*args: Any, **kw: Any) -> Any:
        loads.append(kw)
        return real_load(*args, **kw)

    monkeypatch.setattr(torch, "load", spy)
    got: list[tuple[str, torch.Tensor]] = []
    ext = WeightSyncExtension()
    ext.model_runner = SimpleNamespace(model=SimpleNamespace(
        load_weights=lambda weights: got.extend(weights)))
    assert ext.slurmrl_load_weights(str(path)) == 1
    assert [n for n, _ in got] == ["model.embed_tokens.weight"]
    assert torch.equal(got[0][1], torch.arange(8.0).reshape(4, 2))
    assert loads[0]["mmap"] is True and loads[0]["weights_only"] is True


def test_a_load_that_fails_is_refused_and_generate_waits_for_a_complete_set() -> None:
    engine = FakeEngine(refuse=ValueError("size mismatch for model.embed_tokens.weight"))
    b = _backend(engine)
    with pytest.raises(BackendError, match=r"weights do not fit the model \(size mismatch"
                       r".*\); partly replaced: import a complete set"):
        b.import_weights(_blob())
    assert not engine.paths[0].exists()  # removed on error too
    with pytest.raises(NotReady, match=r"weights are not loaded \(the last import failed"):
        b.generate(["a"], GenerateParams())
    engine.refuse = None
    b.import_weights(_blob())
    assert b._weights_valid


def test_staged_weights_that_fail_at_activation_say_so() -> None:
    engine = FakeEngine(refuse=KeyError("lm_head.bias"))
    b = _backend(engine)
    b.park(1)
    b.import_weights(_blob())  # a state_dict: staged (the engine alone knows its names)
    with pytest.raises(BackendError, match=r"weights imported while parked were not "
                       r"loaded: weights do not fit the model \('lm_head.bias'\)"):
        b.activate()
    assert b.residency is Residency.ACTIVE and not b.staged
    with pytest.raises(NotReady, match=r"weights are not loaded \(the last import "
                       r"failed: 'lm_head.bias'\)") as err:
        b.generate(["a"], GenerateParams())
    assert "level 2" not in str(err.value) and "level-2" not in str(err.value)
