"""What a driver sees when its phase request is given up or its job ends under it.

The controller is a stand-in on loopback (tests/unit/client/_controller_standin.py) that
answers as docs/rpc.md says the real one does; the controller's own side (a release of a
waiting request withdraws it) is tested in tests/unit/controller/test_scheduler.py and
test_controller_core.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from _controller_standin import Answer, Call, StandIn, error, lease, until

from slurmrl.client import job as job_module
from slurmrl.client.job import Job, LeaseRevoked, connect
from slurmrl.client.rpc import ControllerError

ENDED = "RL job 42 has ended (F): pool 1 was lost (node failure)"
RELEASE = ("POST", "/v1/jobs/N/leases/N/release")


def _still_waiting(call: Call) -> Answer:
    time.sleep(min(call.body["wait_s"], 0.1))
    return 202, {"request_id": 9, "state": "waiting"}


def _read_back(state: str) -> Callable[[Call], Answer]:
    return lambda call: (200, {"lease": lease(9, state=state)})


@pytest.mark.parametrize(("release", "get", "said"), [
    (_read_back("cancelled"), None, "request 9 was withdrawn"),
    # granted between the last poll and the withdrawal: the same call released it
    (_read_back("released"), None, "withdrawn (granted meanwhile, now released)"),
    # a retry after a restart whose first attempt had landed
    (lambda call: error(409, "lease-conflict", "lease 9 is not held"),
     _read_back("cancelled"), "request 9 was withdrawn"),
], ids=["withdrawn", "granted-meanwhile", "retried"])
def test_a_phase_given_up_withdraws_its_queued_request(
        standin: StandIn, job: Job, release: Callable[[Call], Answer],
        get: Callable[[Call], Answer] | None, said: str) -> None:
    standin.routes["POST", "/v1/jobs/N/leases"] = _still_waiting
    standin.routes[RELEASE] = release
    if get is not None:
        standin.routes["GET", "/v1/jobs/N/leases/N"] = get
    with pytest.raises(TimeoutError, match=r"no rollout lease within 0\.3 s") as got, \
            job.phase("rollout", timeout_s=0.3):
        pass
    assert said in str(got.value)
    assert [c.path for c in standin.seen(*RELEASE)] == ["/v1/jobs/42/leases/9/release"]
    assert job.current is None


def test_acquire_on_a_job_that_ended_says_why(standin: StandIn, job: Job) -> None:
    standin.routes["POST", "/v1/jobs/N/leases"] = lambda call: (202, {
        "request_id": None, "state": "ended", "reason": "pool 3 lost: node failure"})
    with pytest.raises(ControllerError, match="pool 3 lost: node failure") as got:
        job.acquire("rollout")
    assert (got.value.status, got.value.code) == (409, "job-ended")


def _job_ends(standin: StandIn) -> None:
    """From now on the controller answers every call on job 42 as for an ended job."""
    for route in (("POST", "/v1/jobs/N/heartbeat"), ("POST", "/v1/jobs/N/leases/N/shrink"),
                  RELEASE, ("POST", "/v1/jobs/N/end"), ("POST", "/v1/jobs/N/leases")):
        standin.routes[route] = lambda call: error(409, "job-ended", ENDED)
    standin.routes["GET", "/v1/jobs/N/leases/N"] = lambda call: (
        200, {"lease": lease(state="revoked", reason="job-ended")})


def test_the_heartbeat_revokes_the_lease_of_an_ended_job_and_stops(
        standin: StandIn, job: Job) -> None:
    lease = job.acquire("rollout")
    _job_ends(standin)
    until(lambda: lease.revoked_reason is not None)
    assert lease.revoked_reason == ENDED and not lease.held and job.ended_reason == ENDED
    until(lambda: not job._hb.is_alive())  # no more heartbeats: the job is over
    beats = len(standin.seen("POST", "/v1/jobs/N/heartbeat"))
    time.sleep(0.3)
    assert len(standin.seen("POST", "/v1/jobs/N/heartbeat")) == beats
    with pytest.raises(LeaseRevoked, match="pool 1 was lost"):
        lease.shrink(1)


def test_a_shrink_after_the_job_ended_raises_lease_revoked(
        standin: StandIn, job: Job) -> None:
    lease = job.acquire("rollout")
    _job_ends(standin)  # before the heartbeat noticed: the shrink hears it first
    with pytest.raises(LeaseRevoked, match="pool 1 was lost") as got:
        lease.shrink(1)
    assert got.value.reason == ENDED and lease.revoked_reason == ENDED


def test_leaving_the_blocks_of_an_ended_job_raises_lease_revoked_and_closes(
        standin: StandIn, job: Job) -> None:
    with pytest.raises(LeaseRevoked, match="pool 1 was lost"), job, job.phase("rollout"):
        _job_ends(standin)
    assert standin.seen("POST", "/v1/jobs/N/end")  # tried, and found it already ended
    assert job._rpc._conn is None and job._hb_rpc._conn is None
    assert not job._hb.is_alive()


def test_close_releases_at_best_effort_and_closes_both_clients(
        standin: StandIn, job: Job) -> None:
    job.acquire("rollout")
    standin.routes[RELEASE] = lambda call: error(409, "lease-conflict", "lease 5 is not held")
    standin.routes["GET", "/v1/jobs/N/leases/N"] = lambda call: (200, {"lease": lease()})
    job.close()  # the release failed; ending the job ends the lease anyway
    assert standin.seen("POST", "/v1/jobs/N/end")
    assert job._rpc._conn is None and job._hb_rpc._conn is None
    assert not job._hb.is_alive()


@pytest.mark.parametrize(("route", "answer", "key", "act"), [
    (("POST", "/v1/jobs/N/leases"), {"lease_granted": {}}, "lease",
     lambda job: job.acquire("rollout")),
    (("POST", "/v1/jobs/N/leases"), {"lease": {"phase": "rollout"}}, "lease_id",
     lambda job: job.acquire("rollout")),
    (("POST", "/v1/jobs/N/heartbeat"), {"held": [{"id": 5}]}, "lease_id",
     lambda job: job.heartbeat()),
    (("GET", "/v1/jobs/N"), {"jobs": []}, "job", lambda job: job.status()),
    (("POST", "/v1/jobs/N/leases/N/grow"), {"lease": lease()}, "added",
     lambda job: job.acquire("rollout").grow([2])),
], ids=["acquire", "acquire-lease", "heartbeat", "status", "grow"])
def test_an_answer_missing_a_field_is_a_bad_answer_naming_it(
        standin: StandIn, job: Job, route: tuple[str, str], answer: object, key: str,
        act: Callable[[Job], object]) -> None:
    standin.routes[route] = lambda call: (200, answer)
    with pytest.raises(ControllerError, match=f"field '{key}'") as got:
        act(job)
    assert got.value.code == "bad-answer"


def test_registration_answered_without_the_job_is_a_bad_answer(standin: StandIn) -> None:
    standin.routes["POST", "/v1/jobs"] = lambda call: (200, {"jobs": {}})
    with pytest.raises(ControllerError, match="field 'job'") as got:
        Job(42, standin.url, {}, retry_for_s=1.0)
    assert got.value.code == "bad-answer"


def test_a_driver_exiting_with_status_0_finishes_its_job(standin: StandIn, job: Job) -> None:
    with pytest.raises(SystemExit), job:
        raise SystemExit(0)
    (end,) = standin.seen("POST", "/v1/jobs/N/end")
    assert end.body == {"state": "CD", "reason": "driver finished"}


def test_a_failed_deregistration_does_not_hide_the_drivers_own_error(
        standin: StandIn, job: Job) -> None:
    standin.routes["POST", "/v1/jobs/N/end"] = lambda call: error(
        403, "not-your-job", "refused")
    with pytest.raises(ZeroDivisionError), job:
        1 / 0  # noqa: B018 - the driver's own bug
    (end,) = standin.seen("POST", "/v1/jobs/N/end")
    assert end.body["state"] == "F"
    with pytest.raises(ControllerError, match="refused"), job:
        pass  # without an error of its own, the failure to deregister is the error


def test_a_drivers_error_is_not_replaced_by_a_revocation_its_release_finds(
        standin: StandIn, job: Job) -> None:
    # the lease was revoked a moment before the driver's code failed (its heartbeat had
    # not seen it yet): leaving the block, the release finds it revoked; the driver
    # still sees its own error (it saw `LeaseRevoked`, its error's traceback gone)
    job.heartbeat_s = 100.0
    standin.routes[RELEASE] = lambda call: error(409, "lease-conflict", "lease 5 is not held")
    standin.routes["GET", "/v1/jobs/N/leases/N"] = lambda call: (
        200, {"lease": lease(5, state="revoked", reason="expired")})
    with pytest.raises(ValueError, match="CUDA out of memory"), job.phase("rollout"):
        raise ValueError("CUDA out of memory")
    assert standin.seen(*RELEASE)
    # without an error of its own, the revocation is what it sees
    with pytest.raises(LeaseRevoked, match="expired"), job.phase("rollout"):
        pass


def test_a_drivers_error_is_not_replaced_by_a_release_the_controller_refuses(
        standin: StandIn, job: Job) -> None:
    # the release fails with a controller error (here refused; away for good is the
    # same class): the driver's own error is the one it sees, as the guide promises
    job.heartbeat_s = 100.0
    job._rpc.retry_for_s = 0.0
    standin.routes[RELEASE] = lambda call: error(500, "internal", "database is locked")
    with pytest.raises(ValueError, match="trainer diverged"), job.phase("train"):
        raise ValueError("trainer diverged: loss is nan")
    assert standin.seen(*RELEASE)
    with pytest.raises(ControllerError, match="database is locked"), job.phase("train"):
        pass  # without an error of its own, the failed release is the error


def test_a_grow_whose_answer_was_lost_is_resent_and_names_what_it_took(
        standin: StandIn, job: Job) -> None:
    # the controller answers a grow once its hand-off is done; one that outlasts the
    # client's timeout is resent, with the GPUs the lease held when asked, so that the
    # controller answers what the first attempt took (it answered nothing, and a
    # rollout never used the GPUs it was charged for)
    job._rpc.timeout_s = 0.5
    bodies: list[dict[str, object]] = []

    def grow(call: Call) -> Answer:
        bodies.append(call.body)
        if len(bodies) == 1:
            time.sleep(1.0)  # its hand-off outlasts the client's timeout
        grown = {**lease(), "gpus": [0, 1, 2, 3], "local_gpus": [0, 1, 2, 3]}
        return 200, {"lease": grown, "added": sorted(
            set(call.body["gpus"]) - set(call.body["held"]))}  # type: ignore[call-overload]

    standin.routes["POST", "/v1/jobs/N/leases/N/grow"] = grow
    with job.phase("rollout") as held:
        assert held.grow([2, 3]) == (2, 3)
        assert held.gpus == (0, 1, 2, 3)
    assert len(bodies) == 2 and bodies[0] == bodies[1] == {"gpus": [2, 3], "held": [0, 1]}


def test_a_heartbeat_stuck_on_a_dead_connection_is_given_up_for_a_new_one(
        standin: StandIn, job: Job) -> None:
    # a heartbeat whose answer never comes (a half-open connection) blocked the thread
    # for the RPC's 30 s, three lease timeouts: the lease lapsed though the controller
    # was back. It is given up after two beats (at least 1 s) and the next one sent
    job.acquire("rollout")  # heartbeat_s 0.05 from now on
    stalled: list[float] = []

    def beat(call: Call) -> Answer:
        if not stalled:
            stalled.append(time.monotonic())
            time.sleep(6.0)  # never answered in time
        return 200, {"job_id": 42, "state": "R", "held": standin.held, "heartbeat_s": 0.05}

    standin.routes["POST", "/v1/jobs/N/heartbeat"] = beat
    until(lambda: stalled)
    seen = len(standin.seen("POST", "/v1/jobs/N/heartbeat"))
    until(lambda: len(standin.seen("POST", "/v1/jobs/N/heartbeat")) > seen, within_s=4.0)
    assert time.monotonic() - stalled[0] < 4.0


def test_connect_in_the_shell_salloc_started_says_to_run_the_driver_as_a_step() -> None:
    # salloc's shell has the job's id and the plugin's job-control variables, but the
    # directives are exported to the job's steps only (checked on the dev cluster)
    env = {"SLURM_JOB_ID": "635", "SLURM_SPANK_SLURMRL_GPUS": "1"}
    with pytest.raises(RuntimeError, match=r"run the driver as a step of the allocation "
                       r"\(srun python driver\.py\)"):
        connect(env, retry_for_s=0)


def test_heartbeats_follow_the_sites_interval_from_the_first_one(standin: StandIn) -> None:
    # the stand-in's site beats every 0.05 s; the client assumed 2 s until its first
    # grant, so a request waiting meanwhile lapsed at a lease timeout under 2 s
    waiting = {"on": True}
    standin.routes["POST", "/v1/jobs/N/leases"] = lambda call: (
        (202, {"request_id": 9, "state": "waiting"}) if waiting["on"]
        else (200, {"lease": lease(5)}))
    job = Job(42, standin.url, {"SLURMRL_GPUS": "2"}, retry_for_s=5.0)
    try:
        with pytest.raises(TimeoutError):
            job.acquire("rollout", timeout_s=1.0, poll_s=0.2)
        beats = standin.seen("POST", "/v1/jobs/N/heartbeat")
        assert len(beats) >= 5, len(beats)
        waiting["on"] = False
        job.acquire("rollout")
        granted = len(standin.seen("POST", "/v1/jobs/N/heartbeat"))
        until(lambda: len(standin.seen("POST", "/v1/jobs/N/heartbeat")) > granted, 0.5)
    finally:
        job.close()


def test_a_driver_whose_main_thread_died_stops_renewing_its_lease(
        standin: StandIn, tmp_path: Path) -> None:
    # it raised with a non-daemon thread still running: Python waits for that thread,
    # and the heartbeats kept the lease held (a hung thread held it forever)
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(f"""
        import sys, threading, time
        from slurmrl.client import rpc
        from slurmrl.client.job import Job
        rpc.sign_request = lambda *a, **k: "MUNGE stub"
        job = Job(42, {standin.url!r}, {{"SLURMRL_GPUS": "2"}}, retry_for_s=2.0)
        job.acquire("rollout")
        threading.Thread(target=time.sleep, args=(3.0,)).start()  # not a daemon
        raise RuntimeError("the driver failed")
        """))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    proc = subprocess.Popen([sys.executable, str(driver)], env=env,
                            stderr=subprocess.PIPE, text=True)
    until(lambda: standin.seen("POST", "/v1/jobs/N/leases"), 20.0)
    time.sleep(1.0)  # the main thread has raised by now; the other thread sleeps on
    beats = len(standin.seen("POST", "/v1/jobs/N/heartbeat"))
    time.sleep(1.0)
    assert len(standin.seen("POST", "/v1/jobs/N/heartbeat")) == beats
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 1
    assert "the driver's main thread has ended; heartbeats stop" in err


def test_after_giving_up_on_the_controller_the_drivers_clean_up_tries_once(
        standin: StandIn, caplog: pytest.LogCaptureFixture) -> None:
    # the release and the deregistration each retried for retry_for_s more, silently:
    # a driver took three times retry_for_s (15 minutes by default) to stop
    job = Job(42, standin.url, {"SLURMRL_GPUS": "2"}, retry_for_s=0.5)
    with pytest.raises(ControllerError, match="controller restarting"), job, \
            job.phase("rollout"):
        for route in [*standin.routes, ("POST", "/v1/jobs/N/observations")]:
            standin.routes[route] = lambda call: error(503, "unavailable",  # it went
                                                      "controller restarting")
        job.observe("reward", time.time(), time.time())
    assert len(standin.seen("POST", "/v1/jobs/N/leases/N/release")) == 1
    assert len(standin.seen("POST", "/v1/jobs/N/end")) == 1
    assert "gave up on POST /v1/jobs/42/observations" in caplog.text


def test_a_long_wait_for_placement_says_why_once(standin: StandIn, job: Job,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    # acquire(timeout_s=None) polled in silence while the job was not placed: a user
    # saw a hang, with the controller's reason only in a TimeoutError at the end
    standin.routes["POST", "/v1/jobs/N/leases"] = lambda call: (202, {
        "request_id": None, "state": "unplaced", "reason": "PoolPending (no free GPUs)"})
    caplog.set_level("INFO", logger="slurmrl.client.job")
    with pytest.raises(TimeoutError):
        job.acquire("rollout", timeout_s=0.6, poll_s=0.1)
    said = [r.getMessage() for r in caplog.records if "waits for its placement" in
            r.getMessage()]
    assert said == ["RL job 42: rollout lease waits for its placement in a pool "
                    "(PoolPending (no free GPUs))"]


def _away(standin: StandIn, how: str, job: Job | None = None) -> None:
    """The controller goes away: it answers 503 while it starts, or is not there (and
    `job`'s open connection with it)."""
    if how == "unreachable":
        standin.stop()
        if job is not None:
            job._rpc.close()
        return
    for route in [*standin.routes]:
        standin.routes[route] = lambda call: error(503, "starting", "controller starting")


@pytest.mark.parametrize("how", ["503", "unreachable"])
def test_a_phases_timeout_holds_while_the_controller_is_away(
        standin: StandIn, job: Job, how: str) -> None:
    # each acquire retried for retry_for_s (5 s here, 300 s by default) whatever the
    # phase's timeout_s, then raised ControllerError, not TimeoutError
    _away(standin, how, job)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"no rollout lease within 0\.5 s \(controller "
                                           r"away: .*\); no request was queued"), \
            job.phase("rollout", timeout_s=0.5):
        pass
    assert time.monotonic() - started < 2.5
    assert not job._rpc.lost  # the phase gave up; the client did not: clean-up retries


def test_a_request_queued_before_the_controller_went_away_is_withdrawn_once(
        standin: StandIn, job: Job) -> None:
    def queued_then_away(call: Call) -> Answer:
        _away(standin, "503")  # from the next call on, acquire's included
        return _still_waiting(call)

    standin.routes["POST", "/v1/jobs/N/leases"] = queued_then_away
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="request 9 may still be queued"):
        job.acquire("rollout", timeout_s=0.5, poll_s=0.1)
    assert time.monotonic() - started < 2.5
    assert len(standin.seen(*RELEASE)) == 1  # tried once: the controller is away


def test_withdrawing_a_phase_given_up_retries_briefly(
        standin: StandIn, job: Job, monkeypatch: pytest.MonkeyPatch) -> None:
    # the withdrawal retried for retry_for_s more (5 s here, 300 s by default)
    monkeypatch.setattr(job_module, "WITHDRAW_RETRY_S", 0.3)
    standin.routes["POST", "/v1/jobs/N/leases"] = _still_waiting
    standin.routes[RELEASE] = lambda call: error(503, "starting", "controller starting")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="request 9 may still be queued"):
        job.acquire("rollout", timeout_s=0.3, poll_s=0.1)
    assert time.monotonic() - started < 2.5
    assert len(standin.seen(*RELEASE)) >= 2  # retried, briefly


def test_without_a_timeout_an_acquire_still_waits_out_a_restart(
        standin: StandIn, job: Job) -> None:
    answers = iter([error(503, "starting", "controller starting")] * 3)
    standin.routes["POST", "/v1/jobs/N/leases"] = lambda call: next(
        answers, (200, {"lease": lease()}))
    assert job.acquire("rollout").lease_id == 5


def test_a_heartbeat_renews_the_leases_deadline(standin: StandIn, job: Job) -> None:
    # deadline_at was the grant's for good, though each heartbeat renews the lease
    renewed = {"at": time.time() + 10}
    standin.routes["POST", "/v1/jobs/N/heartbeat"] = lambda call: (200, {
        "job_id": 42, "state": "R", "heartbeat_s": 0.05,
        "held": [dict(x, deadline_at=renewed["at"]) for x in standin.held]})
    with job.phase("rollout") as held:
        renewed["at"] = held.deadline_at + 60
        until(lambda: held.deadline_at == renewed["at"])


def test_a_failed_drivers_job_ends_with_its_errors_type_and_message(
        standin: StandIn, job: Job) -> None:
    with pytest.raises(RuntimeError), job:
        raise RuntimeError("CUDA error: an illegal memory access\nwas encountered")
    (end,) = standin.seen("POST", "/v1/jobs/N/end")
    assert end.body == {"state": "F", "reason": "driver raised RuntimeError: CUDA error: "
                                                "an illegal memory access was encountered"}


def test_a_failed_drivers_long_message_is_cut(standin: StandIn, job: Job) -> None:
    with pytest.raises(ValueError), job:
        raise ValueError("x" * 10_000)
    (end,) = standin.seen("POST", "/v1/jobs/N/end")
    reason = end.body["reason"]
    assert reason.startswith("driver raised ValueError: xxx") and reason.endswith("...")
    assert len(reason) <= len("driver raised ValueError: ") + job_module.FAILURE_MESSAGE_MAX
