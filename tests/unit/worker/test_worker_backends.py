"""Backend selection, the torch backend on CPU, and the vLLM import guard."""

from __future__ import annotations

import pytest

from slurmrl.model import Residency
from slurmrl.worker.backends import BackendOptions, load_factory, make_backend
from slurmrl.worker.protocol import BackendError, GenerateParams, Role, ServiceBackend
from slurmrl.worker.tiny import TinyBackend


def test_every_backend_satisfies_the_protocol() -> None:
    tiny = make_backend("tiny", Role.ROLLOUT, BackendOptions())
    torch_b = make_backend("torch", Role.TRAINER, BackendOptions(device="cpu"))
    vllm = make_backend("vllm", Role.ROLLOUT, BackendOptions(model="Qwen/Qwen3-0.6B"))
    for b in (tiny, torch_b, vllm):
        assert isinstance(b, ServiceBackend)


def test_torch_trainer_on_cpu_trains_parks_and_resumes() -> None:
    b = make_backend("torch", Role.TRAINER, BackendOptions(device="cpu", lr=1e-2))
    b.load()
    roll = TinyBackend(Role.ROLLOUT)
    roll.load()
    batch = [s.with_advantage(1.0) for s in roll.generate(["1+2="], GenerateParams()).samples]
    first = b.train_step(batch)
    b.park(1)
    assert b.residency is Residency.PARKED and b.memory().device_bytes == 0
    b.activate()
    second = b.train_step(batch)
    assert second["step"] == first["step"] + 1
    with pytest.raises(BackendError, match="does not generate"):
        b.generate(["1="], GenerateParams())


def test_wrong_role_or_missing_model_is_refused_clearly() -> None:
    with pytest.raises(BackendError, match="torch backend is a trainer"):
        make_backend("torch", Role.ROLLOUT, BackendOptions(device="cpu"))
    with pytest.raises(BackendError, match="rollout engine"):
        make_backend("vllm", Role.TRAINER, BackendOptions(model="m"))
    with pytest.raises(BackendError, match="needs --model"):
        make_backend("vllm", Role.ROLLOUT, BackendOptions())
    with pytest.raises(BackendError, match="unknown backend 'sglang'; valid: tiny, torch, vllm"):
        make_backend("sglang", Role.ROLLOUT, BackendOptions())


def test_cuda_without_a_gpu_says_so() -> None:
    with pytest.raises(BackendError, match="needs a GPU"):
        make_backend("torch", Role.TRAINER, BackendOptions(device="cuda"))


def test_vllm_not_installed_names_the_extra() -> None:
    # vLLM is never installed in CI; this checks the guard itself
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.fail("vLLM is installed here; this test checks the not-installed path")
    b = make_backend("vllm", Role.ROLLOUT, BackendOptions(model="Qwen/Qwen3-0.6B"))
    with pytest.raises(BackendError, match=r"slurmrl\[vllm\]"):
        b.load()
    assert b.residency is Residency.STOPPED


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nocolon", "must look like"),
        ("no_such_module_xyz:f", "cannot import"),
        ("slurmrl.worker.lm:NoSuch", "no callable"),
    ],
)
def test_bad_model_factory_specs(spec: str, message: str) -> None:
    with pytest.raises(BackendError, match=message):
        load_factory(spec)


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs an NVIDIA GPU")
def test_torch_trainer_on_cuda_frees_gpu_memory_when_parked() -> None:
    import torch

    b = make_backend("torch", Role.TRAINER, BackendOptions(device="cuda", lr=1e-2))
    b.load()
    roll = TinyBackend(Role.ROLLOUT)
    roll.load()
    batch = [s.with_advantage(1.0) for s in roll.generate(["1+2="], GenerateParams()).samples]
    b.train_step(batch)
    allocated = torch.cuda.memory_allocated()
    weights = sum(p.numel() * p.element_size() for p in b._model.parameters())  # type: ignore[union-attr]
    b.park(1)
    # the weights and Adam's state leave the GPU, not only the gradients
    assert torch.cuda.memory_allocated() <= allocated - 3 * weights
    assert all(p.numel() == 0 for p in b._model.parameters())  # type: ignore[union-attr]
    assert b.memory().device_bytes == 0
    b.activate()
    assert b.train_step(batch)["step"] == 2.0


def test_a_dropped_model_keeps_the_buffers_its_weights_do_not_carry() -> None:
    # rotary frequencies and such are registered persistent=False: no state_dict (so no
    # weight sync) brings them back, and a drop gave them back as zeros
    import torch
    from torch import nn

    from slurmrl.worker.torch_backend import TorchModelBackend

    class Rotary(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self.register_buffer("inv_freq", torch.arange(1.0, 3.0), persistent=False)

    b = TorchModelBackend(Role.ROLLOUT, Rotary, device="cpu")
    b.load()
    blob = b.export_weights()
    b.park(2)
    b.activate()
    b.import_weights(blob)
    model = b._model
    assert model is not None
    assert model.inv_freq.tolist() == [1.0, 2.0]  # type: ignore[operator]
