"""The tiny backend: real sampling and training on CPU, surviving park/activate."""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch

from slurmrl.model import Residency
from slurmrl.worker.protocol import (
    BackendError,
    Continuation,
    GenerateParams,
    MemoryUse,
    NotReady,
    Role,
    TrainSample,
)
from slurmrl.worker.tiny import TinyBackend

PROMPTS = ["12+7=", "3*4=", "9-5=", "1+1=", "20+22="]
PARAMS = GenerateParams(max_tokens=12, temperature=1.0, seed=7, micro_batch=2)


def _rollout(seed: int = 0) -> TinyBackend:
    b = TinyBackend(Role.ROLLOUT, seed=seed)
    b.load()
    return b


def _trainer(seed: int = 0) -> TinyBackend:
    b = TinyBackend(Role.TRAINER, seed=seed)
    b.load()
    return b


def _batch(backend: TinyBackend, seed: int) -> list[TrainSample]:
    out = _rollout().generate(PROMPTS, GenerateParams(seed=seed, max_tokens=8))
    return [s.with_advantage(1.0 if i % 2 else -0.5) for i, s in enumerate(out.samples)]


def _weights(b: TinyBackend) -> dict[str, torch.Tensor]:
    return torch.load(__import__("io").BytesIO(b.export_weights()), weights_only=True)


def test_same_seed_same_outputs_and_other_seed_differs() -> None:
    b = _rollout()
    first = b.generate(PROMPTS, PARAMS)
    assert first == b.generate(PROMPTS, PARAMS)
    other = b.generate(PROMPTS, GenerateParams(max_tokens=12, seed=8, micro_batch=2))
    assert [s.completion_ids for s in other.samples] != [
        s.completion_ids for s in first.samples
    ]
    assert [s.prompt for s in first.samples] == PROMPTS


def test_a_batch_split_over_replicas_samples_as_one_engine() -> None:
    # what ReplicatedRollout does: fixed micro-batches, each told its place in the batch
    from dataclasses import replace

    from slurmrl.client.replicas import _merge

    b = _rollout()
    whole = b.generate(PROMPTS, PARAMS)
    mb = PARAMS.micro_batch
    parts = {start: b.generate(PROMPTS[start:start + mb], replace(PARAMS, first_index=start))
             for start in range(0, len(PROMPTS), mb)}
    back = [4, 0, 2]  # the order replicas returned them: any
    merged = _merge(parts, back, {0: [*parts[0].active_trace], 1: [*parts[2].active_trace]})
    assert [s.completion_ids for s in merged.samples] == [
        s.completion_ids for s in whole.samples]
    assert [s.prompt for s in merged.samples] == PROMPTS
    assert sorted(s.finish_rank for s in merged.samples) == list(range(len(PROMPTS)))
    assert merged.samples[4].finish_rank == 0  # its micro-batch came back first
    # without first_index the second micro-batch would sample as the first one does
    assert b.generate(PROMPTS[2:4], PARAMS) != parts[2]


def test_finish_order_and_active_trace_describe_the_tail() -> None:
    out = _rollout().generate(PROMPTS, PARAMS)
    assert sorted(s.finish_rank for s in out.samples) == list(range(len(PROMPTS)))
    trace = out.active_trace
    assert trace[-1] == 0
    assert list(trace) == sorted(trace, reverse=True)  # the count only shrinks
    assert trace[0] <= len(PROMPTS)
    for s in out.samples:
        assert s.finish_reason in ("stop", "length")
        if s.finish_reason == "length":
            assert len(s.completion_ids) == PARAMS.max_tokens


def test_park_frees_the_device_copy_and_activate_restores_outputs() -> None:
    b = _rollout()
    before = b.generate(PROMPTS, PARAMS)
    active_mem = b.memory()
    b.park(1)
    assert b.residency is Residency.PARKED
    assert b.memory().device_bytes == 0
    assert b.memory().host_bytes == active_mem.device_bytes
    with pytest.raises(NotReady, match="parked"):
        b.generate(PROMPTS, PARAMS)
    b.activate()
    assert b.residency is Residency.ACTIVE
    assert b.generate(PROMPTS, PARAMS) == before


def test_drop_then_activate_refuses_generate_until_weights_arrive() -> None:
    b = _rollout()
    before = b.generate(PROMPTS, PARAMS)
    blob = b.export_weights()
    b.park(2)
    assert b.residency is Residency.DROPPED
    b.activate()
    with pytest.raises(NotReady, match="import weights"):
        b.generate(PROMPTS, PARAMS)
    b.import_weights(blob)
    assert b.generate(PROMPTS, PARAMS) == before


def test_training_resumes_identically_after_park() -> None:
    a, control = _trainer(), _trainer()
    batch1, batch2 = _batch(a, 1), _batch(a, 2)
    assert a.train_step(batch1) == control.train_step(batch1)
    a.park(1)
    assert a.memory().device_bytes == 0
    a.activate()
    m_a, m_c = a.train_step(batch2), control.train_step(batch2)
    assert m_a == m_c
    wa, wc = _weights(a), _weights(control)
    assert all(torch.equal(wa[k], wc[k]) for k in wc)


def test_a_lost_optimizer_state_would_show() -> None:
    # The check above is only meaningful if Adam's state changes the second step.
    a, fresh = _trainer(), _trainer()
    batch1, batch2 = _batch(a, 1), _batch(a, 2)
    a.train_step(batch1)
    fresh.train_step(batch1)
    fresh._opt = torch.optim.Adam(fresh._model.parameters(), lr=3e-3)  # type: ignore[union-attr]
    assert a.train_step(batch2)["loss"] == fresh.train_step(batch2)["loss"]
    wa, wf = _weights(a), _weights(fresh)
    assert any(not torch.equal(wa[k], wf[k]) for k in wa)


def test_training_changes_weights_and_sync_makes_rollout_equal_trainer() -> None:
    trainer, rollout = _trainer(), _rollout()
    before = rollout.generate(PROMPTS, PARAMS)
    for seed in range(3):
        metrics = trainer.train_step(_batch(trainer, seed))
        assert metrics["tokens"] > 0 and metrics["step"] == seed + 1
    rollout.import_weights(trainer.export_weights())
    wt, wr = _weights(trainer), _weights(rollout)
    assert all(torch.equal(wt[k], wr[k]) for k in wt)
    assert rollout.generate(PROMPTS, PARAMS) != before


def test_trainer_cannot_drop_and_rollout_cannot_train() -> None:
    with pytest.raises(BackendError, match="level 2"):
        _trainer().park(2)
    with pytest.raises(BackendError, match="trainer call"):
        _rollout().train_step([TrainSample((4,), (5, 2), 1.0)])
    with pytest.raises(BackendError, match="park level must be 1"):
        _rollout().park(3)


def test_bad_inputs_name_what_is_wrong() -> None:
    b = _rollout()
    with pytest.raises(BackendError, match=r"\['x'\]"):
        b.generate(["1+x="], PARAMS)
    with pytest.raises(BackendError, match="at least one prompt"):
        b.generate([], PARAMS)
    with pytest.raises(BackendError, match="not a torch state_dict"):
        b.import_weights(b"garbage")
    with pytest.raises(BackendError, match="do not fit"):
        import io

        buf = io.BytesIO()
        torch.save({"embed.weight": torch.zeros(2, 2)}, buf)
        b.import_weights(buf.getvalue())
    t = _trainer()
    # the sample and its field named, and the last valid id (it said 0..18 of 18)
    with pytest.raises(BackendError, match=r"samples\[1\]\.completion_ids has token id "
                                           r"500 outside the model's vocabulary \(0\.\.17\)"):
        t.train_step([TrainSample((4,), (5,), 1.0), TrainSample((4,), (5, 500), 1.0)])
    with pytest.raises(BackendError, match=r"samples\[0\]\.prompt_ids has token id 18 "):
        t.train_step([TrainSample((18,), (5,), 1.0)])


def test_a_temperature_too_small_to_divide_by_samples_greedily() -> None:
    # logits / 1e-310 overflowed: every sequence ended at once on PAD ("stop")
    b = TinyBackend(Role.ROLLOUT)
    b.load()
    greedy = b.generate(["1+2=", "3+4="], GenerateParams(max_tokens=6, temperature=0.0,
                                                          seed=1)).samples
    tiny = b.generate(["1+2=", "3+4="], GenerateParams(max_tokens=6, temperature=1e-310,
                                                        seed=1)).samples
    assert [s.completion_ids for s in tiny] == [s.completion_ids for s in greedy]


@pytest.mark.parametrize("lr", [float("inf"), float("nan"), 0.0, -1.0])
def test_a_learning_rate_that_is_not_a_finite_positive_number_is_refused(lr: float) -> None:
    # inf made the weights NaN at the first step; 0 silently became the default
    from slurmrl.worker.backends import BackendOptions, make_backend

    for backend in ("tiny", "torch"):
        with pytest.raises(BackendError, match="learning rate must be a finite number > 0"):
            make_backend(backend, Role.TRAINER, BackendOptions(device="cpu", lr=lr))


def _trained_blob() -> bytes:
    trainer = _trainer()
    for seed in range(2):
        trainer.train_step(_batch(trainer, seed))
    return trainer.export_weights()


@pytest.mark.parametrize("level", [1, 2])
def test_weights_synced_while_parked_are_generated_with_after_activate(level: int) -> None:
    blob = _trained_blob()
    reference = _rollout()  # got the weights while active: loaded at once
    reference.import_weights(blob)
    expected = reference.generate(PROMPTS, PARAMS)
    parked = _rollout()
    before = parked.generate(PROMPTS, PARAMS)
    assert expected != before  # the sync changes what is generated
    parked.park(level)
    host_before = parked.memory().host_bytes
    parked.import_weights(blob)
    # staged in host buffers (those it had parked; a dropped model holds none, and gets
    # them for the weights: the state_dict's bytes); the device copy was not touched
    assert parked.residency is not Residency.ACTIVE and parked.staged
    weights = sum(v.numel() * v.element_size() for v in _weights(reference).values())
    assert parked.memory() == MemoryUse(0, host_before if level == 1 else weights)
    if level == 2:
        assert host_before == 0  # TinyLM has no non-persistent buffers to keep
    with pytest.raises(NotReady):
        parked.generate(PROMPTS, PARAMS)
    parked.activate()
    assert not parked.staged
    assert parked.generate(PROMPTS, PARAMS) == expected
    wp, wr = _weights(parked), _weights(reference)
    assert all(torch.equal(wp[k], wr[k]) for k in wr)


def test_bad_weights_for_a_parked_rollout_are_refused_and_change_nothing() -> None:
    import io

    b = _rollout()
    before = b.generate(PROMPTS, PARAMS)
    good = _weights(b)
    bad = {k: (torch.zeros(3, 3) if i == 0 else v) for i, (k, v) in enumerate(good.items())}
    buf = io.BytesIO()
    torch.save(bad, buf)
    b.park(1)
    with pytest.raises(BackendError, match="does not match"):
        b.import_weights(buf.getvalue())
    with pytest.raises(BackendError, match="missing keys"):
        buf = io.BytesIO()
        torch.save({"x": torch.zeros(1)}, buf)
        b.import_weights(buf.getvalue())
    assert not b.staged
    b.activate()
    assert b.generate(PROMPTS, PARAMS) == before


def test_a_sequence_continued_from_its_prefix_samples_as_if_never_cut() -> None:
    # what a consolidating replicated rollout does between rounds: cut every sequence
    # after 4 tokens, continue the unfinished ones elsewhere, in another order
    whole = _rollout().generate(PROMPTS, PARAMS)
    head = _rollout().generate(PROMPTS, replace(PARAMS, max_tokens=4))
    open_ = [k for k, s in enumerate(head.samples) if s.finish_reason == "length"]
    assert open_, "every sample stopped within 4 tokens: the test would show nothing"
    open_.reverse()
    other = _rollout()  # a second replica, same weights
    rest = other.generate([PROMPTS[k] for k in open_], replace(PARAMS, max_tokens=8),
                          Continuation(tuple(open_),
                                       tuple(head.samples[k].completion_ids for k in open_)))
    for k, s in zip(open_, rest.samples, strict=True):
        assert s.completion_ids == whole.samples[k].completion_ids
        assert s.completion == whole.samples[k].completion
        assert s.prompt_ids == whole.samples[k].prompt_ids
        assert s.finish_step == whole.samples[k].finish_step
    # the place in the batch decides the sampling: other indices, other outputs
    moved = other.generate([PROMPTS[k] for k in open_], replace(PARAMS, max_tokens=8),
                           Continuation(tuple(k + 100 for k in open_),
                                        tuple(head.samples[k].completion_ids for k in open_)))
    assert moved != rest


def test_sampling_follows_the_models_distribution() -> None:
    # the first token of 4,000 copies of one prompt, each at its own place in the batch,
    # against the model's softmax: the counter-based sampler is a faithful sampler
    b = _rollout()
    n = 4000
    out = b.generate(["12+7="] * n, GenerateParams(max_tokens=1, seed=3, micro_batch=n))
    model = b._model
    assert model is not None
    with torch.no_grad():
        ids = torch.tensor([[1, *b.tokenizer.encode("12+7=")]])
        probs = torch.softmax(model(ids)[0, -1], dim=-1)
    counts = torch.zeros_like(probs)
    for s in out.samples:
        counts[s.completion_ids[0]] += 1
    tv = 0.5 * float((counts / n - probs).abs().sum())
    assert tv < 0.04, tv  # sampling error alone: ~0.02 at n = 4,000 over 18 tokens


def _blob(state: dict[Any, Any]) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def _spoil_last(good: dict[str, torch.Tensor],
                spoil: Callable[[torch.Tensor], torch.Tensor]) -> dict[Any, Any]:
    """New values for every tensor, the last spoiled: an import that copied as it checked
    would have replaced all the others when it met it."""
    *head, last = good
    return {**{k: torch.full_like(good[k], 0.5) for k in head}, last: spoil(good[last])}


REFUSED = {
    "a wrong shape": (lambda t: torch.zeros(3), "does not match the model's"),
    "a sparse tensor": (lambda t: t.to_sparse(), "sparse_coo tensor, not a dense one"),
    "an integer dtype": (lambda t: t.long(), "has dtype torch.int64, the model's is"),
}


@pytest.mark.parametrize("level", [0, 1], ids=["active", "parked"])
@pytest.mark.parametrize("case", list(REFUSED))
def test_a_refused_import_changes_nothing(level: int, case: str) -> None:
    spoil, message = REFUSED[case]
    b = _rollout()
    before, good = b.generate(PROMPTS, PARAMS), _weights(b)
    if level:
        b.park(level)
    with pytest.raises(BackendError, match=message):
        b.import_weights(_blob(_spoil_last(good, spoil)))
    with pytest.raises(BackendError, match=r"unexpected keys \['x', 7\]"):
        b.import_weights(_blob({**good, 7: torch.zeros(1), "x": torch.zeros(1)}))
    assert b.weights_version == 0 and not b.staged
    b.activate()
    now = _weights(b)
    assert all(torch.equal(now[k], good[k]) for k in good)
    assert b.generate(PROMPTS, PARAMS) == before


@pytest.mark.parametrize("level", [0, 1], ids=["active", "parked"])
def test_an_import_torn_mid_copy_says_so_and_runs_with_no_half_weights(
        level: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # what the checks cannot foresee (a device error mid-copy): the weights are torn
    b = _rollout()
    blob = b.export_weights()
    if level:
        b.park(level)
        target: Any = b._offloader
        monkeypatch.setattr(target, "write_host", _fail_mid_copy)
    else:
        target = b._model
        monkeypatch.setattr(target, "load_state_dict", _fail_mid_copy)
    with pytest.raises(BackendError, match="partly replaced: import a complete set"):
        b.import_weights(blob)
    monkeypatch.undo()
    b.activate()
    with pytest.raises(NotReady, match="partly replaced by a failed import"):
        b.generate(PROMPTS, PARAMS)
    b.import_weights(blob)  # a complete set: runs again
    b.generate(PROMPTS, PARAMS)


def _fail_mid_copy(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


@pytest.mark.parametrize("advantage", [1e39, -3e38 * 10], ids=["1e39", "-3e39"])
def test_a_non_finite_step_is_not_taken_and_training_goes_on(advantage: float) -> None:
    # finite as a Python float, infinite as float32: the loss is NaN, and a step taken
    # with it would make every weight NaN for good
    t, control = _trainer(), _trainer()
    batch = _batch(t, 1)
    t.train_step(batch)
    control.train_step(batch)
    before = _weights(t)
    with pytest.raises(BackendError, match="step not applied: non-finite loss/gradient"):
        t.train_step([TrainSample((4, 5), (6, 2), advantage)])
    now = _weights(t)
    assert all(torch.equal(now[k], before[k]) for k in before)
    assert (t.steps, t.weights_version) == (1, 1)
    # the optimizer state too: the next step is the one a trainer never refused takes
    batch2 = _batch(t, 2)
    assert t.train_step(batch2) == control.train_step(batch2)
    wt, wc = _weights(t), _weights(control)
    assert all(torch.equal(wt[k], wc[k]) for k in wc)
