"""Hand-off between two copies of one service (floating pools), on the CPU backends.

Two backend objects of the same class and seed stand for the copies on two GPU windows
(in a pool they are two processes on one node); the state file between them is real.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from _worker_service import train_batches

from slurmrl.model import Residency
from slurmrl.worker.backends import BackendOptions, make_backend
from slurmrl.worker.handoff import peek_generation
from slurmrl.worker.protocol import (
    BackendError,
    GenerateParams,
    NotReady,
    Role,
    ServiceBackend,
    TrainSample,
)
from slurmrl.worker.tiny import TinyBackend
from slurmrl.worker.torch_backend import TorchModelBackend

PROMPTS = ["1+2=", "30*4=", "9-7="]
SAMPLING = GenerateParams(max_tokens=10, temperature=1.0, seed=11)


def _tiny_trainer() -> TorchModelBackend:
    return TinyBackend(Role.TRAINER, lr=1e-2, seed=3)


def _torch_trainer() -> TorchModelBackend:
    b = make_backend("torch", Role.TRAINER, BackendOptions(device="cpu", lr=1e-2, seed=3))
    assert isinstance(b, TorchModelBackend)
    return b


def _loaded(make: Callable[[], TorchModelBackend]) -> TorchModelBackend:
    b = make()
    b.load()
    return b


def _loaded_after(make: Callable[[], TorchModelBackend],
                  batches: list[list[TrainSample]]) -> TorchModelBackend:
    b = _loaded(make)
    for batch in batches:
        b.train_step(batch)
    return b


def _params(b: ServiceBackend) -> list[torch.Tensor]:
    assert isinstance(b, TorchModelBackend) and b._model is not None
    return [p.detach().clone() for p in b._model.parameters()]


def _same(x: list[torch.Tensor], y: list[torch.Tensor]) -> bool:
    return len(x) == len(y) and all(torch.equal(a, b) for a, b in zip(x, y, strict=True))


@pytest.mark.parametrize("make", [_tiny_trainer, _torch_trainer], ids=["tiny", "torch"])
def test_a_trainer_handed_to_another_copy_trains_on_bit_identically(
    tmp_path: Path, make: Callable[[], TorchModelBackend]
) -> None:
    k = 3
    batches = train_batches(k + 1)
    reference = _loaded(make)
    for b in batches:
        reference.train_step(b)

    first = _loaded(make)
    for b in batches[:k]:
        first.train_step(b)
    first.hand_off(tmp_path / "trainer.state")
    second = _loaded(make)  # the copy on the other window, fresh from the same seed
    second.take_over(tmp_path / "trainer.state")
    metrics = second.train_step(batches[k])

    assert _same(_params(second), _params(reference))
    assert metrics["step"] == k + 1 and second.steps == reference.steps
    assert second.weights_version == reference.weights_version
    assert second.residency is Residency.ACTIVE and not second.handed_off
    assert (first.generation, second.generation) == (1, 1)

    # weights alone do not resume Adam: the moments travel in the state file too
    weights_only = _loaded(make)
    weights_only.import_weights(_loaded_after(make, batches[:k]).export_weights())
    weights_only.train_step(batches[k])
    assert not _same(_params(weights_only), _params(reference))


@pytest.mark.parametrize("make", [_tiny_trainer, _torch_trainer], ids=["tiny", "torch"])
def test_a_trainer_moved_back_and_forth_trains_on_bit_identically(
    tmp_path: Path, make: Callable[[], TorchModelBackend]
) -> None:
    batches = train_batches(5)
    reference = _loaded_after(make, batches)
    path = tmp_path / "trainer.state"
    a, b = _loaded(make), _loaded(make)
    a.train_step(batches[0])
    for batch in batches[1:]:
        # the second move onwards lands in a copy that holds Adam state of its own
        a.hand_off(path)
        b.take_over(path)
        b.train_step(batch)
        a, b = b, a
    assert _same(_params(a), _params(reference))
    assert (a.steps, a.generation) == (5, 4)
    assert a._opt is not None and reference._opt is not None
    mine, ref = a._opt.state_dict(), reference._opt.state_dict()
    assert mine["param_groups"] == ref["param_groups"]
    for idx, entry in ref["state"].items():
        assert mine["state"][idx].keys() == entry.keys()
        assert all(torch.equal(mine["state"][idx][k], v) for k, v in entry.items())


def test_a_rollout_handed_to_another_copy_samples_what_it_would_have(
    tmp_path: Path,
) -> None:
    trained = _loaded_after(_tiny_trainer, train_batches(2)).export_weights()
    reference = _loaded(lambda: TinyBackend(Role.ROLLOUT))
    reference.import_weights(trained)
    first = _loaded(lambda: TinyBackend(Role.ROLLOUT))
    first.import_weights(trained)
    second = _loaded(lambda: TinyBackend(Role.ROLLOUT))
    assert second.generate(PROMPTS, SAMPLING) != reference.generate(PROMPTS, SAMPLING)

    first.hand_off(tmp_path / "rollout.state")
    second.take_over(tmp_path / "rollout.state")
    assert second.generate(PROMPTS, SAMPLING) == reference.generate(PROMPTS, SAMPLING)
    assert second.weights_version == reference.weights_version == 1


def test_hand_off_frees_the_device_and_host_copies(tmp_path: Path) -> None:
    b = _loaded(_tiny_trainer)
    b.train_step(train_batches(1)[0])  # Adam's moments exist now
    before = b.memory()
    assert before.device_bytes > 0
    b.hand_off(tmp_path / "trainer.state")
    assert b.memory().device_bytes == 0 and b.memory().host_bytes == 0
    assert b.residency is Residency.PARKED and b.handed_off
    # the state is in the file, not here: nothing runs, nothing is activated plainly
    with pytest.raises(NotReady, match="handed its state"):
        b.activate()
    with pytest.raises(NotReady, match="handed its state"):
        b.import_weights(_loaded(_tiny_trainer).export_weights())
    with pytest.raises(NotReady):
        b.train_step(train_batches(1)[0])
    # and it takes its state back, bigger than nothing again
    b.take_over(tmp_path / "trainer.state")
    assert b.memory().device_bytes == before.device_bytes


def test_hand_off_twice_writes_once_and_only_an_active_copy_hands_off(
    tmp_path: Path,
) -> None:
    path = tmp_path / "rollout.state"
    b = _loaded(lambda: TinyBackend(Role.ROLLOUT))
    b.hand_off(path)
    written = path.stat().st_mtime_ns, path.stat().st_ino
    b.hand_off(path)
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == written
    assert b.generation == 0  # untouched since it loaded: the state of generation 0

    parked = _loaded(lambda: TinyBackend(Role.ROLLOUT))
    parked.park(1)
    with pytest.raises(NotReady, match="only an active service hands its state off"):
        parked.hand_off(tmp_path / "other.state")
    parked.close()
    with pytest.raises(NotReady):
        parked.hand_off(tmp_path / "other.state")
    assert not (tmp_path / "other.state").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["rollout.state"]  # no temp files left


def test_a_fresh_copy_does_not_overwrite_newer_handed_off_state(tmp_path: Path) -> None:
    path = tmp_path / "trainer.state"
    trained = _loaded_after(_tiny_trainer, train_batches(2))
    expected = _params(trained)
    trained.hand_off(path)  # generation 1
    fresh = _loaded(_tiny_trainer)  # a copy coming up on another window, generation 0
    fresh.hand_off(path)
    assert fresh.handed_off and fresh.memory().device_bytes == 0
    fresh.take_over(path)
    assert _same(_params(fresh), expected) and fresh.steps == 2 and fresh.generation == 1


def test_generations_count_hand_offs_back_and_forth(tmp_path: Path) -> None:
    path = tmp_path / "trainer.state"
    batch = train_batches(1)[0]
    a, b = _loaded(_tiny_trainer), _loaded(_tiny_trainer)
    a.train_step(batch)
    a.hand_off(path)
    b.take_over(path)
    b.train_step(batch)
    b.hand_off(path)
    a.take_over(path)
    assert (a.generation, b.generation, a.steps) == (2, 2, 2)
    assert a.residency is Residency.ACTIVE and not a.handed_off and b.handed_off


def _stale_file(tmp_path: Path) -> tuple[Path, TorchModelBackend]:
    """A copy at generation 2 and a copy of the generation-1 file."""
    path = tmp_path / "trainer.state"
    a, b = _loaded(_tiny_trainer), _loaded(_tiny_trainer)
    a.train_step(train_batches(1)[0])
    a.hand_off(path)
    stale = tmp_path / "stale.state"
    stale.write_bytes(path.read_bytes())
    b.take_over(path)
    b.train_step(train_batches(1)[0])
    b.hand_off(path)
    a.take_over(path)
    assert a.generation == 2
    return stale, a


def _refused_changes_nothing(b: TorchModelBackend, path: Path, message: str) -> None:
    before = (_params(b), b.steps, b.weights_version, b.generation, b.residency)
    with pytest.raises(BackendError, match=message):
        b.take_over(path)
    assert _same(_params(b), before[0])
    assert (b.steps, b.weights_version, b.generation, b.residency) == before[1:]
    b.train_step(train_batches(1)[0])  # still a working trainer


def test_take_over_refuses_an_older_generation(tmp_path: Path) -> None:
    stale, b = _stale_file(tmp_path)
    _refused_changes_nothing(b, stale, "generation 1, older than this copy's 2")


def test_take_over_refuses_a_missing_file(tmp_path: Path) -> None:
    b = _loaded_after(_tiny_trainer, train_batches(1))
    _refused_changes_nothing(b, tmp_path / "trainer.state", "no handoff state at")
    # a handed-off copy stays handed off
    b.hand_off(tmp_path / "trainer.state")
    (tmp_path / "trainer.state").unlink()
    with pytest.raises(BackendError, match="no handoff state at"):
        b.take_over(tmp_path / "trainer.state")
    assert b.handed_off and b.residency is Residency.PARKED


@pytest.mark.parametrize("damage", ["garbage", "truncated", "not a state file"])
def test_take_over_refuses_a_corrupt_file(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "trainer.state"
    _loaded(_tiny_trainer).hand_off(path)
    if damage == "garbage":
        path.write_bytes(b"\x00not a torch file")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:-200])
    else:
        torch.save({"weights": torch.ones(2)}, path)
    b = _loaded_after(_tiny_trainer, train_batches(1))
    _refused_changes_nothing(b, path, "corrupt|not a slurmrl-handoff")


def test_take_over_refuses_state_that_does_not_fit(tmp_path: Path) -> None:
    path = tmp_path / "trainer.state"
    narrow = TinyBackend(Role.TRAINER, seed=3, dim=32)
    narrow.load()
    narrow.hand_off(path)
    b = _loaded_after(_tiny_trainer, train_batches(1))
    _refused_changes_nothing(b, path, "does not fit this model.*shape")

    rollout = _loaded(lambda: TinyBackend(Role.ROLLOUT))
    rollout.hand_off(tmp_path / "rollout.state")
    _refused_changes_nothing(b, tmp_path / "rollout.state", "written by a tiny rollout")


def test_a_failed_write_leaves_the_copy_active(tmp_path: Path) -> None:
    b = _loaded_after(_tiny_trainer, train_batches(1))
    with pytest.raises(BackendError, match="cannot write the handoff state"):
        b.hand_off(tmp_path / "no-such-dir" / "trainer.state")
    assert b.residency is Residency.ACTIVE and not b.handed_off and b.generation == 0
    assert b.memory().device_bytes > 0
    b.train_step(train_batches(1)[0])


def test_the_state_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "rollout.state"
    _loaded(lambda: TinyBackend(Role.ROLLOUT)).hand_off(path)
    assert path.stat().st_mode & 0o077 == 0
    assert os.stat(path).st_uid == os.geteuid()


def test_a_fresh_copy_on_another_node_never_ties_with_the_first_trained_hand_off(
    tmp_path: Path,
) -> None:
    # a job trained alone on one window, never handing off; a second window opens on
    # another node and the job's fresh copy there hands off at once (as the controller
    # launches it). The trained state's first hand-off must read newer than that one,
    # or the copies of the other node would take the fresh state for the newest
    node_x, node_y = tmp_path / "x", tmp_path / "y"
    node_x.mkdir()
    node_y.mkdir()
    trained = _loaded_after(_tiny_trainer, train_batches(2))
    fresh = _loaded(_tiny_trainer)
    fresh.hand_off(node_y / "trainer.state")
    trained.hand_off(node_x / "trainer.state")
    assert (fresh.generation, trained.generation) == (0, 1)
    assert peek_generation(node_x / "trainer.state") > peek_generation(node_y / "trainer.state")
    # taken over and handed back untouched: the same state, the same generation
    again = _loaded(_tiny_trainer)
    again.take_over(node_x / "trainer.state")
    again.hand_off(tmp_path / "trainer.state")
    assert again.generation == 1 and peek_generation(tmp_path / "trainer.state") == 1


class _DropoutLM(torch.nn.Module):
    """A tiny model whose training draws random numbers (dropout)."""

    def __init__(self) -> None:
        super().__init__()
        from slurmrl.worker.lm import TinyLM

        self.lm = TinyLM()
        self.drop = torch.nn.Dropout(0.3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.lm.gru(self.drop(self.lm.embed(ids)))
        return self.lm.head(out)  # type: ignore[no-any-return]


def test_a_trainer_with_dropout_draws_on_after_a_hand_off_as_in_one_process(
        tmp_path: Path) -> None:
    # the hand-off carried no random-number state: the copy that took over replayed
    # its own dropout masks from its load, and trained differently
    def make() -> TorchModelBackend:
        return TorchModelBackend(Role.TRAINER, _DropoutLM, device="cpu", lr=1e-2, seed=3)

    batches = train_batches(5)
    reference = _loaded(make)
    losses = [reference.train_step(b)["loss"] for b in batches]
    first = _loaded(make)
    for b in batches[:2]:
        first.train_step(b)
    first.hand_off(tmp_path / "trainer.state")
    second = _loaded(make)
    second.take_over(tmp_path / "trainer.state")
    assert [second.train_step(b)["loss"] for b in batches[2:]] == losses[2:]
    assert _same(_params(second), _params(reference))
