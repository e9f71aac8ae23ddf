"""The floating-window estimate (benchmarks/floating.py) on hand-built jobs whose answer
is known: docs/benchmarks.md quotes its figures as the case for building the mechanism,
so its event model must give a member its whole window, queue it when none is free and
pack tails only where they fit."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from slurmrl.model import Layout, Phase
from slurmrl.sim.workload import Segment, SimJob

_spec = importlib.util.spec_from_file_location(
    "floating", Path(__file__).resolve().parents[2] / "benchmarks" / "floating.py")
assert _spec is not None and _spec.loader is not None
floating = importlib.util.module_from_spec(_spec)
sys.modules["floating"] = floating  # its dataclasses look themselves up there
_spec.loader.exec_module(floating)


def job(jid: int, segs: list[tuple[Phase, float]], steps: int = 10,
        tail: tuple[tuple[float, int], ...] = ()) -> SimJob:
    step = tuple(Segment(p, s) for p, s in segs)
    return SimJob(jid, "c", f"u{jid}", 0.0, "Qwen2.5-7B", 7e9, 8, Layout.COLOCATED, 8,
                  (step,) * steps, tail, None, None, False)


def test_as_many_windows_as_members_is_running_alone() -> None:
    jobs = [job(i, [(Phase.TRAIN, 100.0), (Phase.REWARD, 100.0)]) for i in (1, 2, 3)]
    r = floating.run_group(jobs, 3)
    assert r.slowdowns == (1.0, 1.0, 1.0)
    assert abs(r.saved) < 1e-9


def test_a_perfect_complement_shares_one_window_at_its_switch_costs_only() -> None:
    # A trains while B checks rewards and the other way round, 10 steps of 200 s each
    a = job(1, [(Phase.TRAIN, 100.0), (Phase.REWARD, 100.0)])
    b = job(2, [(Phase.REWARD, 100.0), (Phase.TRAIN, 100.0)])
    r = floating.run_group([a, b], 1)
    assert max(r.slowdowns) < 1.08  # a park and an activate of a 7B state per handoff
    assert r.saved > 0.45  # one window of 8 GPUs where dedicated took two


def test_two_whole_set_jobs_on_one_window_queue_behind_each_other() -> None:
    jobs = [job(i, [(Phase.TRAIN, 100.0), (Phase.REWARD, 10.0)]) for i in (1, 2)]
    r = floating.run_group(jobs, 1)
    assert max(r.slowdowns) > 1.7  # each waits the other's training nearly every step


def test_tails_that_fit_one_window_together_free_the_other_for_a_third_member() -> None:
    # each rollout needs the whole set for its first 20% and 4 of 8 GPUs after: two tails
    # share a window, so a third member's training need not wait for them to end
    tail = ((0.2, 4),)
    jobs = [job(i, [(Phase.ROLLOUT, 200.0), (Phase.TRAIN, 60.0), (Phase.REWARD, 20.0)],
                tail=tail) for i in (1, 2, 3)]
    held = floating.run_group(jobs, 2, pack_tails=False)
    packed = floating.run_group(jobs, 2, pack_tails=True)
    assert max(packed.slowdowns) < max(held.slowdowns) - 0.05
    assert packed.saved > held.saved
