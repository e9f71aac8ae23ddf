"""The controller's snapshot builder feeding the real site policies.

Jobs live in a real Store with phase observations as the scheduler records them; the
snapshot the controller builds from them goes to the default pairing policy and the
site-limits admission policy, the objects the simulator runs. Also: a site config that
names an unknown policy stops `slurmrl controller` at start, naming the valid ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from policies.base import Action, JobSnapshot, NodeFree, Verdict
from policies.registry import UnknownPolicy
from slurmrl.config import Config
from slurmrl.config.schema import LimitsConfig, PoliciesConfig
from slurmrl.controller.cli import controller
from slurmrl.controller.placement import (
    JobHistories,
    cluster_snapshot,
    free_gpus,
    job_snapshot,
    load_policies,
    node_free_gpus,
    node_gpus,
    pool_snapshot,
)
from slurmrl.db import JobRecord, PoolRecord, Store
from slurmrl.model import JobState, Layout, Mux, Phase, PhasePrior, RlRequest
from slurmrl.slurm import JobInfo, NodeInfo, SlurmJobState

NODE = NodeInfo("n1", "IDLE", 8, 16, 64000, ("drivers", "pools"))


def _job(store: Store, job_id: int, at: float, mux: Mux = Mux.AUTO, gpus: int = 4) -> JobRecord:
    job = JobRecord(job_id, f"user{job_id}", 1000 + job_id, RlRequest(gpus, "tiny", mux=mux),
                    JobState.PENDING, at, partition="drivers")
    store.add_job(job)
    return job


def _steps(store: Store, job_id: int, offset: float, busy: float, gap: float,
           n: int = 6) -> None:
    """n steps of rollout + train (busy/2 each) then a reported reward gap."""
    t = offset
    for _ in range(n):
        for phase in (Phase.ROLLOUT, Phase.TRAIN):
            store.add_observation(job_id=job_id, phase=phase, requested_at=t, granted_at=t,
                                  released_at=t + busy / 2, gpus=4)
            t += busy / 2
        store.add_observation(job_id=job_id, phase=Phase.REWARD, requested_at=t,
                              granted_at=t, released_at=t + gap)
        t += gap


def test_pairing_sees_the_pool_partitions_largest_node() -> None:
    # a staggered pool must fit one node: the policy is told the partition's node size
    big = NodeInfo("n2", "IDLE", 16, 32, 64000, ("pools",))
    elsewhere = NodeInfo("n3", "IDLE", 72, 32, 64000, ("gpu-other",))
    assert node_gpus([NODE, big, elsewhere], "pools") == {"pools": 16}
    assert node_gpus([elsewhere], "pools") == {}  # unknown: no staggered pool
    snap = cluster_snapshot(0.0, [], [], {"pools": 8}, load_policies(Config()).limits,
                            node_gpus([NODE], "pools"))
    assert snap.node_gpus == {"pools": 8}


def test_a_complementary_pair_shares_one_new_pool_and_mux_off_runs_alone(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "c.db")
    cfg = Config()
    site = load_policies(cfg)
    # two jobs busy 40% of a 10 s step: together they fill the GPUs without slowing down
    a, b = _job(store, 11, 1.0), _job(store, 12, 2.0)
    _steps(store, 11, 0.0, busy=4.0, gap=6.0)
    _steps(store, 12, 5.0, busy=4.0, gap=6.0)
    alone = _job(store, 13, 3.0, mux=Mux.OFF)
    waiting = [job_snapshot(j, "pools", store.observations(j.job_id)) for j in (alone, b, a)]
    snap_a = waiting[2]
    assert snap_a.profile is not None and snap_a.profile.source == "observed"
    assert snap_a.profile.steps >= 5 and abs(snap_a.profile.period() - 10.0) < 1e-6
    free = free_gpus([NODE], [], [], "pools")
    assert free == {"pools": 8}

    snap = cluster_snapshot(100.0, [], waiting, free, site.limits)
    assert [j.job_id for j in snap.waiting] == [11, 12, 13]  # oldest first
    got = {p.job_id: p for p in site.pairing.place(snap)}
    assert got[11].action is Action.OPEN and got[12].action is Action.OPEN
    assert got[11].pool_id == got[12].pool_id and got[11].pool_id is not None
    assert got[11].predicted_slowdown is not None and got[11].predicted_slowdown < 1.1
    assert got[13].action is Action.DEDICATED


def test_a_job_joins_an_open_pool_and_waits_when_slurm_has_no_gpus(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.db")
    site = load_policies(Config())
    first, second = _job(store, 21, 1.0), _job(store, 22, 2.0)
    _steps(store, 21, 0.0, busy=4.0, gap=6.0)
    _steps(store, 22, 3.0, busy=4.0, gap=6.0)
    pool = PoolRecord(5, 4, "open", 0.0, slurm_job_id=900, partition="pools", nodes=("n1",))
    members = [job_snapshot(first, "pools", store.observations(21))]
    pools = [pool_snapshot(pool, members, "pools", 80 << 30, site.limits)]
    # Slurm runs our pool (4 GPUs) and another job's 4: nothing left to open a pool with
    other = JobInfo(901, "x", "u", 1, SlurmJobState.RUNNING, partition="other",
                    nodes=("n1",), gpu_indices=(4, 5, 6, 7))
    free = free_gpus([NODE], [other], [pool], "pools")
    assert free == {"pools": 0}
    waiting = [job_snapshot(second, "pools", store.observations(22))]
    (pl,) = site.pairing.place(cluster_snapshot(50.0, pools, waiting, free, site.limits))
    assert (pl.action, pl.pool_id) == (Action.JOIN, 5)
    # a never-mux job cannot join it and, with no GPUs free, waits
    third = _job(store, 23, 3.0, mux=Mux.OFF)
    (pl,) = site.pairing.place(cluster_snapshot(
        50.0, pools, [job_snapshot(third, "pools")], free, site.limits))
    assert pl.action is Action.WAIT and "no free GPUs" in pl.reason


def test_admission_rejects_over_the_limit_and_forces_mux_off_dedicated() -> None:
    site = load_policies(Config(limits=LimitsConfig(max_gpus_per_job=8)))
    big = JobRecord(1, "u", 1, RlRequest(16, "tiny"), JobState.PENDING, 0.0)
    verdict = site.admission.admit(job_snapshot(big, "pools"), site.limits)
    assert verdict.verdict is Verdict.REJECT and "limit of 8 GPUs" in verdict.reason
    off = JobRecord(2, "u", 1, RlRequest(2, "tiny", mux=Mux.OFF), JobState.PENDING, 0.0)
    assert site.admission.admit(job_snapshot(off, "pools"), site.limits).verdict \
        is Verdict.DEDICATED


def test_a_pairing_policy_the_controller_cannot_enact_fails_at_load() -> None:
    with pytest.raises(UnknownPolicy, match="complementary"):
        load_policies(Config(policies=PoliciesConfig(pairing="gang")))
    with pytest.raises(UnknownPolicy, match="cannot be imported"):
        load_policies(Config(policies=PoliciesConfig(admission="nosuch.module:Policy")))
    # no module, or a relative one: the same clear refusal (it was a raw ValueError /
    # TypeError out of the controller's start)
    for name in (":", ":Policy", ".policies:Policy"):
        with pytest.raises(UnknownPolicy, match=f"pairing policy '{name}' cannot be "
                           "imported.*package.module:Class"):
            load_policies(Config(policies=PoliciesConfig(pairing=name)))


@pytest.mark.parametrize(("key", "value", "valid"), [
    ("pairing", "best-pairs", "complementary, dedicated, fifo-lock, gang, greedy, random"),
    ("admission", "strict", "site-limits"),
])
def test_controller_start_fails_on_an_unknown_policy_naming_the_valid_ones(
        tmp_path: Path, key: str, value: str, valid: str) -> None:
    site = tmp_path / "slurmrl.toml"
    site.write_text(f'[policies]\n{key} = "{value}"\n')
    result = CliRunner().invoke(controller, ["--config", str(site),
                                             "--db", str(tmp_path / "c.db")])
    assert result.exit_code == 1
    assert f"unknown {key} policy {value!r}; valid: {valid}" in result.output
    assert not (tmp_path / "c.db").exists()  # stopped before opening anything


def test_priors_say_a_rollout_holds_its_set_as_the_controller_runs_it(tmp_path: Path) -> None:
    """Before any observation the controller's priors have a rollout hold its whole set
    (it does not shrink a lease through the tail). Two disaggregated jobs whose rollouts
    fill their set 60% of a step are then not paired; the designed prior, where a
    shrinking tail frees most of the set, predicted the pair at 1.04/1.12 and paired it,
    and such jobs then ran above their limits (benchmarks/controller_gap.py)."""
    from dataclasses import replace

    from policies import complementarity
    from slurmrl.model import Layout, PhasePrior
    from slurmrl.profiles import profile_from_prior

    store = Store(tmp_path / "c.db")
    site = load_policies(Config())
    prior = PhasePrior(((Phase.ROLLOUT, 0.6), (Phase.TRAIN, 0.35), (Phase.REWARD, 0.05)),
                       10.0)
    jobs = []
    for jid in (31, 32):
        job = JobRecord(jid, f"user{jid}", 1000 + jid,
                        RlRequest(4, "tiny", profile=prior, layout=Layout.DISAGGREGATED,
                                  rollout_gpus=2), JobState.PENDING, float(jid),
                        partition="drivers")
        store.add_job(job)
        jobs.append(job)
    snaps = [job_snapshot(j, "pools", store.observations(j.job_id)) for j in jobs]
    assert all(s.profile is not None for s in snaps)
    assert snaps[0].profile.phases[Phase.ROLLOUT].gpu_share == 1.0  # type: ignore[union-attr]
    free = free_gpus([NODE], [], [], "pools")
    got = site.pairing.place(cluster_snapshot(10.0, [], snaps, free, site.limits))
    assert [p.action for p in got] == [Action.OPEN, Action.OPEN]
    assert got[0].pool_id != got[1].pool_id
    designed = [replace(s, profile=profile_from_prior(prior, spread=0.15)) for s in snaps]
    complementarity.clear_caches()
    got = site.pairing.place(cluster_snapshot(10.0, [], designed, free, site.limits))
    assert got[0].pool_id == got[1].pool_id
    # a job with neither a profile nor observations gets the prior by model size, the same
    plain = _job(store, 33, 3.0)
    snap = job_snapshot(plain, "pools", [])
    assert snap.profile is not None and snap.profile.source == "prior"
    assert snap.profile.phases[Phase.ROLLOUT].gpu_share == 1.0


def test_a_job_whose_rollouts_shrank_is_profiled_with_the_share_it_held(
        tmp_path: Path) -> None:
    """Rollouts run as replicas give finished replicas' GPUs back: the ledger charged
    each rollout lease half its set's GPU-seconds, so the job's profile says its rollout
    holds half its set (what pairing may overlap), and its training the whole set."""
    store = Store(tmp_path / "c.db")
    job = _job(store, 41, 0.0)
    t = 0.0
    for _ in range(6):
        for phase, held in ((Phase.ROLLOUT, 2), (Phase.TRAIN, 4)):
            store.add_observation(job_id=41, phase=phase, requested_at=t, granted_at=t,
                                  released_at=t + 10, gpus=held,
                                  detail={"gpu_s": held * 10.0})
            t += 10
    prof = job_snapshot(job, "pools", store.observations(41)).profile
    assert prof is not None and prof.source != "prior"
    assert prof.phases[Phase.ROLLOUT].gpu_share == pytest.approx(0.5)
    assert prof.phases[Phase.TRAIN].gpu_share == 1.0


def test_a_running_job_is_snapshotted_with_how_long_it_has_run_and_its_steps(
        tmp_path: Path) -> None:
    """What pairing needs to judge a pool member's whole run: the time since its first
    phase began (not since it registered: start-up is not its work), its complete
    steps, and its `--rl-steps`; a job that has run nothing has run 0 s."""
    store = Store(tmp_path / "c.db")
    job = JobRecord(51, "user51", 1051, RlRequest(4, "tiny", steps=40), JobState.RUNNING,
                    0.0, partition="drivers")
    store.add_job(job)
    _steps(store, 51, offset=30.0, busy=6.0, gap=4.0, n=6)  # 6 steps of 10 s from t=30
    snap = job_snapshot(job, "pools", store.observations(51), now=100.0)
    assert snap.running_s == pytest.approx(70.0)
    assert snap.request.steps == 40
    assert snap.profile is not None and snap.profile.steps == 5  # the 6th: not yet closed
    assert job_snapshot(job, "pools", [], now=100.0).running_s == 0.0


def _disaggregated(store: Store, job_id: int, prior: PhasePrior) -> JobRecord:
    job = JobRecord(job_id, f"user{job_id}", 1000 + job_id,
                    RlRequest(4, "tiny", profile=prior, layout=Layout.DISAGGREGATED,
                              rollout_gpus=2), JobState.PENDING, float(job_id),
                    partition="drivers")
    store.add_job(job)
    return job


def test_a_profile_prior_without_a_step_period_still_keeps_two_busy_jobs_apart(
        tmp_path: Path) -> None:
    # `--rl-profile=rollout=0.6,train=0.35,reward=0.05` (no `step=`, which is optional):
    # the shares hold at the model size's period; they used to give an empty profile,
    # a job with no GPU load, and two 95%-busy jobs then shared one pool
    store = Store(tmp_path / "c.db")
    site = load_policies(Config())
    shares = ((Phase.ROLLOUT, 0.6), (Phase.TRAIN, 0.35), (Phase.REWARD, 0.05))
    snaps = {}
    for step, ids in ((10.0, (31, 32)), (None, (41, 42))):
        jobs = [_disaggregated(store, j, PhasePrior(shares, step)) for j in ids]
        snaps[step] = [job_snapshot(j, "pools", store.observations(j.job_id)) for j in jobs]
    no_step = snaps[None][0].profile
    assert no_step is not None and no_step.duty() == pytest.approx(0.95, abs=0.01)
    for pair in snaps.values():
        placed = site.pairing.place(cluster_snapshot(
            10.0, [], pair, free_gpus([NODE], [], [], "pools"), site.limits))
        assert placed[0].pool_id != placed[1].pool_id  # each its own pool


def test_how_long_a_job_has_run_counts_from_its_leases_not_its_drivers_clock(
        tmp_path: Path) -> None:
    # a driver stamping its reward gaps with time.monotonic() (seconds since boot): the
    # job used to be taken as running since then, decades on the controller's clock
    store = Store(tmp_path / "c.db")
    job = JobRecord(52, "user52", 1052, RlRequest(4, "tiny", steps=40), JobState.RUNNING,
                    1.7e9, partition="drivers")
    store.add_job(job)
    t = 1.7e9 + 30.0
    for _ in range(3):
        for phase in (Phase.ROLLOUT, Phase.TRAIN):
            store.add_observation(job_id=52, phase=phase, requested_at=t, granted_at=t,
                                  released_at=t + 3.0, gpus=4)
            t += 3.0
        store.add_observation(job_id=52, phase=Phase.REWARD, requested_at=5_000.0,
                              granted_at=5_000.0, released_at=5_004.0)
        t += 4.0
    snap = job_snapshot(job, "pools", store.observations(52), now=1.7e9 + 100.0)
    assert snap.running_s == pytest.approx(70.0)


def test_reported_gaps_count_only_where_the_job_was_off_its_gpus(tmp_path: Path) -> None:
    """A driver's reported gaps cannot make its job look less busy than its leases show:
    gaps that span its leases, repeat one another, or come before its first phase (a
    waiting job's) used to stretch its steps, and a partner was placed beside it past
    that partner's slowdown limit."""
    store = Store(tmp_path / "c.db")
    honest, liar, waiting = _job(store, 61, 0.0), _job(store, 62, 0.0), _job(store, 63, 0.0)

    def lie(job_id: int) -> None:  # "reward" from the epoch to 2**40
        store.add_observation(job_id=job_id, phase=Phase.REWARD, requested_at=0.0,
                              granted_at=0.0, released_at=2.0**40)

    for _ in range(3):
        lie(63)
    t = 30.0
    for _ in range(6):  # the same steps, the liar's each with a reward gap of years
        for phase in (Phase.ROLLOUT, Phase.TRAIN, Phase.REWARD):
            for jid in (61, 62):
                store.add_observation(job_id=jid, phase=phase, requested_at=t, granted_at=t,
                                      released_at=t + (3.0 if phase.needs_gpu else 4.0),
                                      gpus=4 if phase.needs_gpu else 0)
            t += 3.0 if phase.needs_gpu else 4.0
        lie(62)
    prof = {j.job_id: job_snapshot(j, "pools", store.observations(j.job_id)).profile
            for j in (honest, liar, waiting)}
    assert all(p is not None for p in prof.values())
    assert prof[61].duty() == pytest.approx(0.6, abs=0.05)  # type: ignore[union-attr]
    # its lies count only as time off its GPUs since its last gap: its steps are as
    # long as they ran (they read 0.0000 busy)
    assert prof[62].duty() == pytest.approx(prof[61].duty(), abs=0.05)  # type: ignore[union-attr]
    # a job that ran no phase yet keeps its prior, whatever it reports
    prior = job_snapshot(_job(store, 64, 0.0), "pools", []).profile
    assert prior is not None
    assert prof[63].duty() == pytest.approx(prior.duty())  # type: ignore[union-attr]


def test_a_jobs_history_is_read_once_and_folds_as_a_fresh_read_does(tmp_path: Path) -> None:
    """Each placement round used to re-read and re-fold every job's whole history (tens
    of thousands of rows for a long agentic job, on the controller's event loop); the
    kept history reads only what is new, and gives the profile a fresh read gives."""
    store = Store(tmp_path / "c.db")
    job = _job(store, 71, 0.0)
    kept, read = JobHistories(), []
    real = store.observations

    def counted(job_id: int | None = None, after: int = 0) -> list:  # type: ignore[type-arg]
        rows = real(job_id, after)
        read.append(len(rows))
        return rows

    store.observations = counted  # type: ignore[method-assign]
    for n in (3, 5, 2):
        t = 30.0 + 10.0 * len(real(71))
        _steps(store, 71, offset=t, busy=6.0, gap=4.0, n=n)
        mine = job_snapshot(job, "pools", now=500.0, history=kept.of(job, store))
        fresh = job_snapshot(job, "pools", real(71), now=500.0)
        assert mine == fresh
    assert read == [9, 15, 6]  # each row once (3 observations a step)
    kept.keep([])
    kept.of(job, store)
    assert read[-1] == 30  # a forgotten job is read anew


@pytest.mark.parametrize("state", [SlurmJobState.RUNNING, SlurmJobState.CONFIGURING,
                                   SlurmJobState.COMPLETING, SlurmJobState.SUSPENDED,
                                   SlurmJobState.STOPPED, SlurmJobState.RESIZING])
def test_gpus_a_job_still_holds_are_not_free(state: SlurmJobState) -> None:
    # a job booting its nodes, ending, or suspended keeps its GPUs: a pool opened on them
    # would pend until the start timeout failed the user's RL job
    other = JobInfo(901, "x", "u", 1, state, partition="other", nodes=("n1",),
                    gpu_indices=(0, 1, 2, 3), gpu_indices_by_node=(("n1", (0, 1, 2, 3)),))
    assert free_gpus([NODE], [other], [], "pools") == {"pools": NODE.gpus - 4}


@pytest.mark.parametrize("state", [SlurmJobState.PENDING, SlurmJobState.COMPLETED,
                                   SlurmJobState.REQUEUE_HOLD])
def test_gpus_of_a_job_queued_or_ended_are_free(state: SlurmJobState) -> None:
    other = JobInfo(901, "x", "u", 1, state, partition="other", nodes=("n1",),
                    gpu_indices=(0, 1, 2, 3), gpu_indices_by_node=(("n1", (0, 1, 2, 3)),))
    assert free_gpus([NODE], [other], [], "pools") == {"pools": NODE.gpus}


def test_each_nodes_free_gpus_are_counted_and_a_pool_no_node_has_room_for_waits() -> None:
    # two pool nodes of 8 GPUs: another job holds 4 on n1 and 2 on n2, our pool (Slurm
    # lists it without GPUs) 4 on n2; a drained node's GPUs are not free; a node of
    # another partition is not counted
    n2 = NodeInfo("n2", "MIXED", 8, 16, 64000, ("pools",))
    drained = NodeInfo("n3", "IDLE+DRAIN", 8, 16, 64000, ("pools",))
    elsewhere = NodeInfo("n4", "IDLE", 8, 16, 64000, ("drivers",))
    other = JobInfo(901, "x", "u", 1, SlurmJobState.RUNNING, partition="other",
                    nodes=("n1", "n2"), gpu_indices=(0, 1, 2, 3),
                    gpu_indices_by_node=(("n1", (0, 1, 2, 3)), ("n2", (6, 7))))
    pool = PoolRecord(5, 4, "open", 0.0, slurm_job_id=900, partition="pools", nodes=("n2",))
    nodes = [NODE, n2, drained, elsewhere]
    assert node_free_gpus(nodes, [other], [pool], "pools") == {"n1": 4, "n2": 2, "n3": 0}
    free = free_gpus(nodes, [other], [pool], "pools")
    assert free == {"pools": 6}
    # the default policy opens no pool of 6 that no node has room for: the job waits,
    # told why, and a younger job of 4 that fits n1 opens
    site = load_policies(Config())
    big = JobSnapshot(41, "u41", RlRequest(6, "tiny", mux=Mux.OFF), None, 1.0)
    small = JobSnapshot(42, "u42", RlRequest(4, "tiny", mux=Mux.OFF), None, 2.0)
    snap = cluster_snapshot(0.0, [], [big, small], free, site.limits,
                            free_nodes={"pools": tuple(NodeFree(f) for f in node_free_gpus(
                                nodes, [other], [pool], "pools").values())})
    by_id = {pl.job_id: pl for pl in site.pairing.place(snap)}
    assert by_id[41].action is Action.WAIT
    assert by_id[41].reason == ("no node of partition 'pools' has 6 GPUs free (at most "
                                "4 on one)")
    assert by_id[42].action is Action.DEDICATED


def test_a_newcomer_with_no_profile_joins_on_the_phases_of_a_running_job_of_its_model(
        tmp_path: Path) -> None:
    # the controller's snapshot of a job that gave no --rl-profile and has run nothing
    # carries the model-size prior (a busy step); beside a running job of its model the
    # pairing judges it on that job's observed phases instead, and it joins
    store = Store(tmp_path / "c.db")
    site = load_policies(Config())
    host = _job(store, 31, 1.0)
    _steps(store, 31, 0.0, busy=4.0, gap=6.0)
    pool = PoolRecord(6, 4, "open", 0.0, slurm_job_id=902, partition="pools", nodes=("n1",))
    members = [job_snapshot(host, "pools", store.observations(31), now=60.0)]
    pools = [pool_snapshot(pool, members, "pools", 80 << 30, site.limits)]
    free = free_gpus([NODE], [], [pool], "pools")
    new = job_snapshot(_job(store, 32, 2.0), "pools")
    assert new.profile is not None and new.profile.source == "prior"
    (pl,) = site.pairing.place(cluster_snapshot(60.0, pools, [new], free, site.limits))
    assert (pl.action, pl.pool_id) == (Action.JOIN, 6)
    # a job of another model is judged on its own prior: too busy to join
    other = JobRecord(33, "user33", 1033, RlRequest(4, "Qwen2.5-7B"), JobState.PENDING, 3.0,
                      partition="drivers")
    store.add_job(other)
    (pl,) = site.pairing.place(cluster_snapshot(
        60.0, pools, [job_snapshot(other, "pools")], free, site.limits))
    assert pl.action is Action.OPEN
