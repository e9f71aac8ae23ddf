"""Residency planning on hand-built pools where the right answer is known."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slurmrl.controller.residency import (
    Footprint,
    GpuCapacity,
    ResidencyError,
    admit,
    footprints_for_job,
    phase_roles,
    plan_floating_grant,
    plan_grant,
)
from slurmrl.gpu.estimate import GiB
from slurmrl.model import Layout, Phase, Residency, RlRequest

CAP80 = [GpuCapacity(i, 80 * GiB) for i in range(4)]


def fp(job: int, role: str, gpus: tuple[int, ...], active: float, parked: float = 1,
       host: float = 10, residency: Residency = Residency.ACTIVE,
       replica: int | None = None) -> Footprint:
    return Footprint(job, role, frozenset(gpus), int(active * GiB), int(parked * GiB),
                     int(host * GiB), residency, replica)


def test_partner_is_parked_when_both_do_not_fit() -> None:
    services = [fp(1, "rollout", (0, 1), 60), fp(1, "trainer", (0, 1), 30,
                                                  residency=Residency.PARKED),
                fp(2, "rollout", (0, 1), 60, residency=Residency.PARKED),
                fp(2, "trainer", (0, 1), 50)]
    plan = plan_grant(services, CAP80, job_id=1, phase=Phase.ROLLOUT,
                      host_budget_bytes=1000 * GiB)
    assert plan.park == ((2, "trainer"),)
    assert plan.activate == ()  # job 1's rollout is already active
    assert plan.drop == ()


def test_nothing_is_parked_when_everything_fits() -> None:
    services = [fp(1, "rollout", (0, 1), 20), fp(2, "trainer", (0, 1), 20,
                                                  residency=Residency.PARKED)]
    plan = plan_grant(services, CAP80, job_id=2, phase=Phase.TRAIN,
                      host_budget_bytes=100 * GiB)
    assert plan.park == () and plan.activate == ((2, "trainer"),)


def test_services_on_other_gpus_are_left_alone() -> None:
    # disaggregated neighbours: job 2 trains on GPUs 2,3 while job 1 rolls out on 0,1
    services = [fp(1, "rollout", (0, 1), 79, residency=Residency.PARKED),
                fp(2, "trainer", (2, 3), 79)]
    plan = plan_grant(services, CAP80, job_id=1, phase=Phase.ROLLOUT,
                      host_budget_bytes=100 * GiB)
    assert plan.park == () and plan.activate == ((1, "rollout"),)


def test_other_jobs_are_parked_before_this_jobs_idle_service() -> None:
    services = [fp(1, "rollout", (0,), 40, residency=Residency.PARKED),
                fp(1, "trainer", (0,), 30), fp(2, "rollout", (0,), 30)]
    plan = plan_grant(services, CAP80, job_id=1, phase=Phase.ROLLOUT,
                      host_budget_bytes=100 * GiB)
    assert plan.park == ((2, "rollout"),)  # job 1's trainer stays resident


def test_rollouts_are_dropped_when_host_memory_runs_out() -> None:
    services = [fp(1, "trainer", (0,), 70, host=50), fp(2, "rollout", (0,), 70, host=40),
                fp(2, "trainer", (0,), 0.5, residency=Residency.PARKED, host=30)]
    # job 1 trains: job 2's rollout must leave the GPU; 30 + 40 GiB of parked state > 50
    plan = plan_grant(services, CAP80, job_id=1, phase=Phase.TRAIN,
                      host_budget_bytes=50 * GiB)
    assert plan.drop == ((2, "rollout"),) and plan.park == ()
    assert plan.host_bytes_after == 30 * GiB


def test_parking_the_others_stops_at_the_host_budget() -> None:
    # job 2 trains: memory requires one of job 1's services off GPU 0; park_others would
    # park the other too, but 60 + 60 GiB of parked state does not fit a 100 GiB node
    services = [fp(1, "rollout", (0,), 30, host=60), fp(1, "trainer", (0,), 30, host=60),
                fp(2, "trainer", (0,), 30, residency=Residency.PARKED, host=30)]
    plan = plan_grant(services, CAP80, job_id=2, phase=Phase.TRAIN,
                      host_budget_bytes=100 * GiB, park_others=True)
    assert plan.park == ((1, "rollout"),) and plan.drop == ()
    assert plan.host_bytes_after == 60 * GiB
    roomy = plan_grant(services, CAP80, job_id=2, phase=Phase.TRAIN,
                       host_budget_bytes=200 * GiB, park_others=True)
    assert roomy.park == ((1, "rollout"), (1, "trainer"))
    assert roomy.host_bytes_after == 120 * GiB


def test_trainer_state_that_fits_no_host_is_refused_with_the_sizes() -> None:
    services = [fp(1, "rollout", (0,), 70, host=5), fp(2, "trainer", (0,), 70, host=90)]
    with pytest.raises(ResidencyError, match=r"host memory.*50\.00 GiB"):
        plan_grant(services, CAP80, job_id=1, phase=Phase.ROLLOUT,
                   host_budget_bytes=50 * GiB)


def test_a_phase_bigger_than_the_gpu_is_refused_naming_the_gpu() -> None:
    services = [fp(1, "rollout", (2,), 90, residency=Residency.PARKED)]
    with pytest.raises(ResidencyError, match=r"pool GPU 2.*80\.00 GiB"):
        plan_grant(services, CAP80, job_id=1, phase=Phase.ROLLOUT, host_budget_bytes=0)


def test_sync_needs_both_services_of_the_job_active() -> None:
    services = [fp(1, "rollout", (0,), 30, residency=Residency.DROPPED),
                fp(1, "trainer", (0,), 30, residency=Residency.PARKED),
                fp(2, "rollout", (0,), 30)]
    plan = plan_grant(services, CAP80, job_id=1, phase=Phase.SYNC,
                      host_budget_bytes=100 * GiB)
    assert set(plan.activate) == {(1, "rollout"), (1, "trainer")}
    assert plan.park == ((2, "rollout"),)


def test_gaps_need_no_plan() -> None:
    services = [fp(1, "rollout", (0,), 30)]
    assert plan_grant(services, CAP80, job_id=1, phase=Phase.REWARD,
                      host_budget_bytes=0).empty


def test_gpu_capacity_from_nvml_counts_only_foreign_memory() -> None:
    cap = GpuCapacity.from_reading(0, total_bytes=80 * GiB, used_bytes=30 * GiB,
                                   services_bytes=25 * GiB, reserve_bytes=1 * GiB)
    assert cap.usable_bytes == 74 * GiB


def test_declared_rl_mem_wins_over_the_estimate() -> None:
    req = RlRequest(gpus=2, model="Qwen2.5-7B", mem_bytes=40 * GiB)
    ro, tr = footprints_for_job(7, req, (2, 3))
    assert ro.active_bytes == tr.active_bytes == 40 * GiB
    assert ro.gpus == tr.gpus == frozenset({2, 3})
    assert ro.parked_bytes == GiB  # the CUDA context stays
    assert ro.host_bytes == 2 * 39 * GiB


def test_disaggregated_services_are_pinned_to_their_sets() -> None:
    req = RlRequest(gpus=4, model="7B", layout=Layout.DISAGGREGATED, rollout_gpus=1)
    ro, tr = footprints_for_job(7, req, (3, 2, 1, 0))
    assert ro.gpus == frozenset({3}) and tr.gpus == frozenset({0, 1, 2})
    # 7B trainer over 3 GPUs: 16 bytes per parameter plus a 1 GiB context
    assert tr.active_bytes == -(-7_000_000_000 // 3) * 16 + GiB


def test_unsizeable_model_without_rl_mem_is_an_error_naming_it() -> None:
    with pytest.raises(ResidencyError, match="my-model"):
        footprints_for_job(7, RlRequest(gpus=1, model="my-model"), (0,))


def test_admission_refuses_a_job_that_cannot_fit_even_alone() -> None:
    req = RlRequest(gpus=2, model="70B")  # a 70B trainer over 2 GPUs is ~560 GB per GPU
    reason = admit(footprints_for_job(5, req, (0, 1)), [], CAP80, 10_000 * GiB)
    assert reason is not None and "rollout phase" in reason and "pool GPU 0" in reason


def test_admission_refuses_when_parked_state_exceeds_the_node_budget() -> None:
    a = footprints_for_job(1, RlRequest(gpus=2, model="7B"), (0, 1))
    b = footprints_for_job(2, RlRequest(gpus=2, model="7B"), (0, 1))
    # each 7B trainer parks 14 bytes/param = 98 GB on the host
    assert admit(b, a, CAP80, 1000 * GiB) is None
    reason = admit(b, a, CAP80, 100 * GiB)
    assert reason is not None and "host memory" in reason


def test_admission_of_tiny_jobs_on_fake_gpus() -> None:
    a = footprints_for_job(1, RlRequest(gpus=2), (0, 1))
    b = footprints_for_job(2, RlRequest(gpus=2), (2, 3))
    assert admit(b, a, CAP80, 64 * GiB) is None
    assert admit(b, a, [GpuCapacity(0, 80 * GiB)], 64 * GiB) is not None


def test_plan_leaves_inputs_unchanged_and_is_deterministic() -> None:
    services = [fp(1, "rollout", (0,), 60), fp(2, "trainer", (0,), 60,
                                                 residency=Residency.PARKED)]
    snapshot = [replace(s) for s in services]
    p1 = plan_grant(services, CAP80, job_id=2, phase=Phase.TRAIN, host_budget_bytes=GiB * 99)
    p2 = plan_grant(services, CAP80, job_id=2, phase=Phase.TRAIN, host_budget_bytes=GiB * 99)
    assert p1 == p2 and services == snapshot
    assert p1.park == ((1, "rollout"),) and p1.activate == ((2, "trainer"),)


def test_gpus_for_sync_is_the_trainer_set_when_disaggregated() -> None:
    dis = RlRequest(gpus=4, layout=Layout.DISAGGREGATED, rollout_gpus=1)
    assert dis.gpus_for(Phase.ROLLOUT) == (0,)
    assert dis.gpus_for(Phase.TRAIN) == dis.gpus_for(Phase.SYNC) == (1, 2, 3)
    col = RlRequest(gpus=4)
    assert col.gpus_for(Phase.SYNC) == col.gpus_for(Phase.ROLLOUT) == (0, 1, 2, 3)


def test_disaggregated_sync_activates_the_trainer_only() -> None:
    # job 1 disaggregated on pool GPUs 0 (rollout) and 1 (trainer); job 2 colocated on
    # both, rolling out: it holds job 1's rollout set, where job 1's rollout is parked
    req = RlRequest(gpus=2, model="1B", layout=Layout.DISAGGREGATED, rollout_gpus=1)
    ro, tr = footprints_for_job(1, req, (0, 1))
    services = [replace(ro, residency=Residency.PARKED),
                replace(tr, residency=Residency.PARKED),
                fp(2, "rollout", (0, 1), 70), fp(2, "trainer", (0, 1), 30,
                                                  residency=Residency.PARKED)]
    plan = plan_grant(services, CAP80, job_id=1, phase=Phase.SYNC,
                      host_budget_bytes=1000 * GiB)
    assert plan.activate == ((1, "trainer"),)  # the rollout stays parked: staged weights
    assert plan.park == ((2, "rollout"),)  # only for room on GPU 1, the trainer set
    assert phase_roles(Phase.SYNC, [ro, tr]) == ("trainer",)


def test_colocated_sync_still_activates_both_services() -> None:
    ro, tr = footprints_for_job(1, RlRequest(gpus=2, model="1B"), (0, 1))
    services = [replace(ro, residency=Residency.PARKED),
                replace(tr, residency=Residency.PARKED)]
    plan = plan_grant(services, CAP80, job_id=1, phase=Phase.SYNC,
                      host_budget_bytes=1000 * GiB)
    assert set(plan.activate) == {(1, "rollout"), (1, "trainer")}
    assert phase_roles(Phase.SYNC, [ro, tr]) == ("trainer", "rollout")


# -- a rollout run as data-parallel replicas (services.rollout_replica_gpus) ------------
def test_rollout_replicas_split_the_rollout_set_and_name_each_service() -> None:
    req = RlRequest(gpus=4, model="tiny")
    fps = footprints_for_job(7, req, (4, 5, 6, 7), rollout_replica_gpus=2)
    assert [(f.key, sorted(f.gpus)) for f in fps] == [
        ((7, "rollout:0"), [4, 5]), ((7, "rollout:1"), [6, 7]), ((7, "trainer"), [4, 5, 6, 7])]
    # 0, the whole set, or a size that does not divide it: one engine, as before
    for n in (0, 4, 3):
        fps = footprints_for_job(7, req, (4, 5, 6, 7), rollout_replica_gpus=n)
        assert [f.key for f in fps] == [(7, "rollout"), (7, "trainer")]


def test_disaggregated_replicas_cover_the_rollout_set_only() -> None:
    req = RlRequest(gpus=4, model="tiny", layout=Layout.DISAGGREGATED, rollout_gpus=2)
    fps = footprints_for_job(1, req, (0, 1, 2, 3), rollout_replica_gpus=1)
    assert [(f.name, sorted(f.gpus)) for f in fps] == [
        ("rollout:0", [0]), ("rollout:1", [1]), ("trainer", [2, 3])]
    # the sync still needs the trainer only: the replicas' union is not the trainer set
    assert phase_roles(Phase.SYNC, fps) == ("trainer",)


def test_a_rollout_lease_on_part_of_the_set_activates_the_replicas_there() -> None:
    # job 1's tail runs on its replica of GPU 0; job 2's rollout was granted GPU 1 alone
    parked = Residency.PARKED
    services = [fp(1, "rollout", (0,), 30, replica=0), fp(1, "rollout", (1,), 30, replica=1),
                fp(1, "trainer", (0, 1), 30, residency=parked),
                fp(2, "rollout", (0,), 60, residency=parked, replica=0),
                fp(2, "rollout", (1,), 60, residency=parked, replica=1),
                fp(2, "trainer", (0, 1), 30, residency=parked)]
    plan = plan_grant(services, CAP80, job_id=2, phase=Phase.ROLLOUT,
                      host_budget_bytes=1000 * GiB, gpus=(1,))
    assert plan.activate == ((2, "rollout:1"),)  # not its replica on GPU 0, still job 1's
    assert plan.park == ((1, "rollout:1"),)  # job 1's done replica; its tail on 0 runs on
    # the whole set: every replica
    plan = plan_grant(services, CAP80, job_id=2, phase=Phase.ROLLOUT,
                      host_budget_bytes=1000 * GiB)
    assert set(plan.activate) == {(2, "rollout:0"), (2, "rollout:1")}


def test_a_colocated_sync_activates_every_replica_and_the_trainer() -> None:
    req = RlRequest(gpus=2, model="tiny")
    fps = [replace(f, residency=Residency.PARKED)
           for f in footprints_for_job(3, req, (0, 1), rollout_replica_gpus=1)]
    plan = plan_grant(fps, CAP80[:2], job_id=3, phase=Phase.SYNC, host_budget_bytes=100 * GiB,
                      gpus=(0, 1))
    assert set(plan.activate) == {(3, "trainer"), (3, "rollout:0"), (3, "rollout:1")}


def test_a_floating_grant_parks_the_window_and_the_jobs_active_copies_elsewhere() -> None:
    req = RlRequest(2, "tiny")
    a0 = footprints_for_job(1, req, (0, 1), window=0)
    a1 = footprints_for_job(1, req, (2, 3), window=1)
    b0 = footprints_for_job(2, req, (0, 1), window=0)
    cap = [GpuCapacity(i, 80 * GiB) for i in range(4)]
    # job 1's trainer is active on window 1 (its state there); job 2's rollout on window 0
    state = {(1, "trainer@1"): Residency.ACTIVE, (2, "rollout@0"): Residency.ACTIVE,
             (1, "rollout@1"): Residency.ACTIVE}
    services = [replace(f, residency=state.get(f.key, Residency.PARKED))
                for f in (*a0, *a1, *b0)]
    plan = plan_floating_grant(services, cap, job_id=1, phase=Phase.TRAIN, gpus=(0, 1))
    # the state's copy is parked (handed over) and the window cleared, before job 1's
    # trainer on window 0 takes the state over; its rollout elsewhere is left alone
    assert set(plan.park) == {(1, "trainer@1"), (2, "rollout@0")}
    assert plan.activate == ((1, "trainer@0"),) and plan.drop == ()
    # a rollout beside the job's own active trainer on its window stays up while it fits
    roll = plan_floating_grant(services, cap, job_id=1, phase=Phase.ROLLOUT, gpus=(2, 3))
    assert roll.park == () and roll.activate == ()
    # ... and is parked where memory needs it (a GPU of 24 GiB: the tiny pair fits,
    # two 7B services of 20 GiB each do not)
    big = [replace(f, active_bytes=20 * GiB) for f in services]
    small = [GpuCapacity(i, 24 * GiB) for i in range(4)]
    sync = plan_floating_grant(big, small, job_id=1, phase=Phase.TRAIN, gpus=(2, 3))
    assert sync.park == ((1, "rollout@1"),) and sync.activate == ()
    with pytest.raises(ResidencyError, match="no train service"):
        plan_floating_grant(services, cap, job_id=2, phase=Phase.TRAIN, gpus=(2, 3))


def test_a_service_whose_park_timed_out_counts_its_host_copy_too() -> None:
    # job 2's trainer on GPUs 2,3: its park timed out and may have landed (its state
    # then pinned on the host) or not; a park of another job's rollout that memory
    # does not require must not take the budget as if it had not
    landed = replace(fp(2, "trainer", (2, 3), 10, host=40), uncertain=True)
    services = [landed, fp(3, "rollout", (0, 1), 10, host=30),
                fp(1, "rollout", (0, 1), 10, residency=Residency.PARKED, host=5)]
    plan = plan_grant(services, CAP80, job_id=1, phase=Phase.ROLLOUT,
                      host_budget_bytes=50 * GiB, park_others=True)
    assert plan.park == ()  # 40 + 30 GiB would pass the node's 50
    assert plan.activate == ((1, "rollout"),)


def test_a_lease_on_part_of_a_services_gpus_does_not_activate_it() -> None:
    # job 1 shrank its rollout lease to GPU 0 (its engine spans 0,1); job 2's train lease
    # holds GPU 1 only: its trainer, one engine over 0,1, cannot run there, and job 1's
    # rollout, whose job still holds GPU 0, is not parked for it
    parked = Residency.PARKED
    services = [fp(1, "rollout", (0, 1), 30), fp(1, "trainer", (0, 1), 30, residency=parked),
                fp(2, "rollout", (0, 1), 30, residency=parked),
                fp(2, "trainer", (0, 1), 50, residency=parked)]
    plan = plan_grant(services, CAP80, job_id=2, phase=Phase.TRAIN,
                      host_budget_bytes=1000 * GiB, gpus=(1,), park_others=True)
    assert plan.empty
    # on both GPUs it is activated, parking job 1's rollout
    plan = plan_grant(services, CAP80, job_id=2, phase=Phase.TRAIN,
                      host_budget_bytes=1000 * GiB, gpus=(0, 1))
    assert plan.activate == ((2, "trainer"),) and plan.park == ((1, "rollout"),)


def test_a_timed_out_service_being_activated_counts_no_parked_state() -> None:
    # job 1's rollout: its last park timed out (taken as active, its host copy counted);
    # its own grant activates it, so its state leaves the host: 30 GiB, not 70
    services = [replace(fp(1, "rollout", (0,), 30, host=40), uncertain=True),
                fp(1, "trainer", (0,), 30, host=30, residency=Residency.PARKED)]
    plan = plan_grant(services, CAP80, job_id=1, phase=Phase.ROLLOUT,
                      host_budget_bytes=50 * GiB, gpus=(0,))
    assert plan.activate == ((1, "rollout"),) and plan.drop == ()
    assert plan.host_bytes_after == 30 * GiB


def test_parking_a_timed_out_service_of_another_job_adds_no_host_use() -> None:
    # job 2's trainer: its park timed out, its host copy counted already; parking it
    # again for job 1's lease pins nothing more, so it is parked, not left active there
    services = [fp(1, "rollout", (0,), 10, host=10, residency=Residency.PARKED),
                fp(1, "trainer", (0,), 10, host=10, residency=Residency.PARKED),
                replace(fp(2, "trainer", (0,), 10, host=40), uncertain=True)]
    plan = plan_grant(services, CAP80, job_id=1, phase=Phase.ROLLOUT,
                      host_budget_bytes=55 * GiB, gpus=(0,), park_others=True)
    assert plan.park == ((2, "trainer"),) and plan.activate == ((1, "rollout"),)
    assert plan.host_bytes_after == 50 * GiB


def test_footprints_know_which_backends_keep_host_buffers_while_active() -> None:
    req = RlRequest(gpus=1, model="Qwen2.5-1.5B")
    for ro_backend, tr_backend, keeps in (("tiny", "tiny", (True, True)),
                                          ("vllm", "torch", (False, True)),
                                          (None, None, (False, False))):
        ro, tr = footprints_for_job(1, req, [0], rollout_backend=ro_backend,
                                    trainer_backend=tr_backend)
        assert (ro.keeps_host, tr.keeps_host) == keeps
        assert ro.pinned_host_bytes(Residency.ACTIVE) == (ro.host_bytes if keeps[0] else 0)
        assert tr.pinned_host_bytes(Residency.DROPPED) == 0


def test_host_buffers_kept_while_active_count_against_the_budget() -> None:
    # job 1's trainer (tiny/torch) is active and keeps its 50 GiB of host buffers; job 2's
    # rollout, activated, keeps its 20 GiB; job 2's trainer is parked (30 GiB): 100 GiB
    keep = [replace(fp(1, "trainer", (0,), 10, host=50), keeps_host=True),
            replace(fp(2, "rollout", (0,), 10, host=20, residency=Residency.PARKED),
                    keeps_host=True),
            replace(fp(2, "trainer", (0,), 10, host=30, residency=Residency.PARKED),
                    keeps_host=True)]
    plan = plan_grant(keep, CAP80, job_id=2, phase=Phase.ROLLOUT, host_budget_bytes=100 * GiB)
    assert plan.host_bytes_after == 100 * GiB
    with pytest.raises(ResidencyError, match=r"100\.00 GiB.*60\.00 GiB"):
        plan_grant(keep, CAP80, job_id=2, phase=Phase.ROLLOUT, host_budget_bytes=60 * GiB)


def test_admission_counts_the_host_buffers_an_active_phase_keeps() -> None:
    # tiny services: job 1's rollout phase keeps its rollout's buffers while both
    # trainers' state stays on the host (job 2's parked rollout is dropped)
    def job(jid: int) -> list[Footprint]:
        return footprints_for_job(jid, RlRequest(gpus=1, model="Qwen2.5-7B"), [0],
                                  rollout_backend="tiny", trainer_backend="tiny")

    cap = [GpuCapacity(0, 200 * GiB)]
    ro, tr = job(1)
    need = 2 * tr.host_bytes + ro.host_bytes
    assert admit(job(2), job(1), cap, need) is None
    why = admit(job(2), job(1), cap, need - 1)
    assert why is not None and "host memory" in why
