"""What the simulator makes of a pairing or admission policy's output and errors: the
plain string of an enum member is that member, any other value, a join to no pool or a
policy's own exception is one error naming the policy; a generator `place` is read once.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from click.testing import CliRunner

from policies import registry
from policies.base import (
    Action,
    Admission,
    ClusterSnapshot,
    JobSnapshot,
    Placement,
    PoolMode,
    SiteLimits,
)
from slurmrl.sim.engine import SimConfig, SimError, Simulation
from slurmrl.sim.runner import config_for
from slurmrl.sim.workload import SimJob, generate, validate


def jobs_of(n: int) -> tuple[list[SimJob], SimConfig]:
    """`n` small colocated 8-GPU jobs, all submitted at t = 0, on 64 GPUs."""
    w = validate({
        "format": "slurmrl-workload/1", "name": "output", "jobs": n,
        "cluster": {"gpus": 64},
        "arrivals": {"steady": {"rate_per_h": 10.0}, "bursty": {"rate_per_h": 10.0}},
        "limits": {"max_slowdown": 3.0, "default_max_slowdown": 3.0, "max_jobs_per_pool": 2,
                   "max_gpus_per_job": 16},
        "classes": [{"name": "c", "weight": 1, "model": "Qwen2.5-7B", "gpus": 8,
                     "layout": "colocated", "steps": 2, "step_s": 60.0,
                     "shares": {"rollout": 0.3, "train": 0.2, "idle": 0.5}, "tail": "none"}],
    })
    return [replace(j, submit_s=0.0) for j in generate(w, 0, "steady")], config_for(w)


def simulate(pairing: Any, admission: Any = None, n: int = 3) -> Simulation:
    jobs, cfg = jobs_of(n)
    return Simulation(jobs, cfg, pairing, lambda: registry.load("slice", "round-robin"),
                      admission or registry.load("admission", "site-limits")).run()


class Says:
    """Every waiting job alone, with the action it is given (a site's slip: a string);
    with `one_at_a_time` the oldest only, the others told `wait`."""

    name = "says"

    def __init__(self, action: Any, mode: Any = PoolMode.LEASE,
                 one_at_a_time: bool = False) -> None:
        self.action, self.mode, self.one = action, mode, one_at_a_time

    def place(self, snapshot: ClusterSnapshot) -> list[Placement]:
        out = []
        for i, j in enumerate(snapshot.waiting):
            action: Any = "wait" if self.one and i else self.action
            out.append(Placement(j.job_id, action, -1 - i, j.request.gpus))
        return out


class Judges:
    """Admission that gives the verdict it is given (a site's slip: a string)."""

    name = "judges"

    def __init__(self, verdict: Any) -> None:
        self.verdict = verdict

    def admit(self, job: JobSnapshot, limits: SiteLimits) -> Admission:
        return Admission(self.verdict, "told so")


def test_the_plain_string_of_a_member_is_that_member() -> None:
    # "dedicated" opened shared pools, "wait" placed the jobs at once, mode "lease" ran
    # whole-pool locks, "reject" admitted the jobs
    sim = simulate(Says("dedicated", mode="lease"))
    assert sim.mode is PoolMode.LEASE and all(p.mode is PoolMode.LEASE for p in sim.closed)
    assert len(sim.closed) == 3 and all(p.dedicated for p in sim.closed)
    runs = sorted(simulate(Says("open", one_at_a_time=True)).runs.values(),
                  key=lambda r: r.job.job_id)
    for before, after in itertools.pairwise(runs):  # each waited for the one before
        assert before.finished_at is not None and after.placed_at is not None
        assert after.placed_at >= before.finished_at
    sim = simulate(Says(Action.OPEN), Judges("reject"))
    assert [r.reject_reason for r in sim.runs.values() if not r.admitted] == ["told so"] * 3


@pytest.mark.parametrize(("pairing", "admission", "says"), [
    (Says("bogus"), None,
     "pairing policy 'says' gave job 1 action 'bogus'; valid: join, open, dedicated, wait"),
    (Says(Action.OPEN), Judges("maybe"),
     "admission policy 'judges' gave job 1 verdict 'maybe'; valid: accept, reject, "
     "dedicated"),
    (Says(Action.OPEN, mode="leases"), None,
     "pairing policy 'says' has mode 'leases'; valid: lease, lock, gang"),
])
def test_a_value_of_no_member_is_an_error_naming_the_policy(
        pairing: Any, admission: Any, says: str) -> None:
    with pytest.raises(SimError) as err:
        simulate(pairing, admission)
    assert str(err.value) == says


class Lazily:
    """`place` written as a generator: every job alone."""

    name, mode = "lazily", PoolMode.LEASE

    def place(self, snapshot: ClusterSnapshot) -> Iterator[Placement]:
        for j in snapshot.waiting:
            yield Placement(j.job_id, Action.DEDICATED, gpus=j.request.gpus)


def test_a_generator_place_places_every_job() -> None:
    # the completeness check spent it: every job was dropped ("jobs never finished")
    sim = simulate(Lazily())
    assert all(r.finished_at is not None for r in sim.runs.values())


class JoinsNowhere:
    name, mode = "joins-nowhere", PoolMode.LEASE

    def __init__(self, pool_id: int) -> None:
        self.pool_id = pool_id

    def place(self, snapshot: ClusterSnapshot) -> list[Placement]:
        return [Placement(j.job_id, Action.JOIN, self.pool_id) for j in snapshot.waiting]


@pytest.mark.parametrize(("pool_id", "more"), [
    (4242, ""), (-1, " (a provisional id: jobs share a new pool by OPENs of the same id)")])
def test_a_join_to_an_unknown_pool_names_the_policy(pool_id: int, more: str) -> None:
    with pytest.raises(SimError) as err:
        simulate(JoinsNowhere(pool_id))
    assert str(err.value) == (f"pairing policy 'joins-nowhere' told job 1 to join unknown "
                              f"pool {pool_id}{more}")


_RAISES = '''
from policies.base import Action, Placement, PoolMode

class Place:
    name, mode = "place-raises", PoolMode.LEASE
    def place(self, snapshot):
        raise KeyError("oops")

class Lazy:
    name, mode = "lazy-raises", PoolMode.LEASE
    def place(self, snapshot):
        yield from ()
        raise ZeroDivisionError("half way")

class Order:
    name = "order-raises"
    def order(self, view):
        raise IndexError("no such request")

class Admit:
    name = "admit-raises"
    def admit(self, job, limits):
        raise RuntimeError("no licence server")
'''


@pytest.mark.parametrize(("args", "says"), [
    (["--pairing", "siteraises:Place"], "pairing policy 'place-raises' raised KeyError: 'oops'"),
    (["--pairing", "siteraises:Lazy"],
     "pairing policy 'lazy-raises' raised ZeroDivisionError: half way"),
    (["--slice", "siteraises:Order"],
     "slice policy 'order-raises' raised IndexError: no such request"),
    (["--admission", "siteraises:Admit"],
     "admission policy 'admit-raises' raised RuntimeError: no licence server"),
])
def test_a_policy_that_raises_is_one_line_naming_it(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, args: list[str], says: str) -> None:
    # it was a traceback from deep inside the simulator
    from slurmrl.sim.cli import simulate as cli

    (tmp_path / "siteraises.py").write_text(_RAISES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "siteraises", raising=False)
    # (6 jobs that accept a slowdown of 3: shared pools, where requests wait together;
    # a slice policy is asked only to order two or more)
    res = CliRunner().invoke(cli, ["--jobs", "6", "--max-slowdown", "3", *args])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert res.output == f"slurmrl simulate: {says}\n"


def test_the_simulators_own_error_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    # only a policy's exception is told as one line: any other is a bug to report
    from slurmrl.sim import cli

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("the simulator's own")

    monkeypatch.setattr("slurmrl.sim.runner.run_jobs", broken)
    res = CliRunner().invoke(cli.simulate, ["--jobs", "2"])
    assert isinstance(res.exception, KeyError)


def test_a_place_that_raises_is_a_sim_error_naming_it_from_its_own() -> None:
    class Raises:
        name, mode = "raises", PoolMode.LEASE

        def place(self, snapshot: ClusterSnapshot) -> list[Placement]:
            raise KeyError("oops")

    with pytest.raises(SimError, match=r"^pairing policy 'raises' raised KeyError: 'oops'$"
                       ) as err:
        simulate(Raises())
    assert isinstance(err.value.__cause__, KeyError)
