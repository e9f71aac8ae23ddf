"""The service launcher's guards that run before or without Slurm.

The controller runs as root and reads a file from a directory the job's user owns (the
worker's address), and runs each service as the job's user: both checked here on real
files and the real account database, without a pool (no Slurm needed).
"""

from __future__ import annotations

import os
import pwd
import threading
from pathlib import Path

import pytest

from slurmrl.controller.services import (
    ServiceLauncher,
    ServiceLaunchError,
    ServiceSpec,
    read_address_file,
)

ME = os.getuid()


def test_the_address_a_worker_writes_is_read(tmp_path: Path) -> None:
    path = tmp_path / "address"
    assert read_address_file(path, ME) is None  # not written yet
    path.write_text("")
    assert read_address_file(path, ME) is None  # being written
    for address in ("gpu-node-3:40123/0123456789abcdef", "10.0.0.7:8000/fedcba9876543210",
                    "[fe80::1]:9000/00000000ffffffff"):
        path.write_text(address + "\n")
        assert read_address_file(path, ME) == address


def test_a_symlink_planted_as_the_address_file_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "root-only"
    secret.write_text("root:$6$hash:19000:0:99999:7:::\n")
    (tmp_path / "address").symlink_to(secret)
    with pytest.raises(ServiceLaunchError) as err:
        read_address_file(tmp_path / "address", ME)
    assert "$6$hash" not in str(err.value)  # nothing of the target is quoted


def test_a_fifo_as_the_address_file_does_not_block_the_controller(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "address")
    got: list[BaseException] = []

    def read() -> None:
        try:
            read_address_file(tmp_path / "address", ME)
        except BaseException as exc:
            got.append(exc)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout=10)
    assert not t.is_alive(), "reading a FIFO blocked"
    assert len(got) == 1 and isinstance(got[0], ServiceLaunchError)


def test_an_address_file_of_another_owner_or_content_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "address"
    path.write_text("node:1234/0123456789abcdef\n")
    with pytest.raises(ServiceLaunchError, match="not a regular file of the job's user"):
        read_address_file(path, ME + 1)
    for junk in ("not an address", "node:1234 extra", "x" * 400 + ":1/0123456789abcdef",
                 "node:1234", "node:1234/launch", "node:1234/0123456789abcdef/x"):
        path.write_text(junk)
        with pytest.raises(ServiceLaunchError, match="does not hold a host:port/launch") \
                as err:
            read_address_file(path, ME)
        assert junk not in str(err.value)


def test_a_service_runs_as_the_account_of_the_jobs_uid_or_not_at_all(tmp_path: Path) -> None:
    # a job whose Slurm record names another user than its uid's account is refused
    # before anything is launched (no Slurm here: the check comes first)
    me = pwd.getpwuid(ME).pw_name
    launcher = ServiceLauncher(None, tmp_path)  # type: ignore[arg-type]
    spec = ServiceSpec(7, "rollout", "someone-else", (0,), uid=ME)
    with pytest.raises(ServiceLaunchError, match=f"uid {ME} is '{me}'"):
        launcher.launch(1, "node", spec, "s" * 32)
    assert list(tmp_path.iterdir()) == []  # no service directory was made


def test_a_services_directory_others_may_write_to_is_refused(tmp_path: Path) -> None:
    # the root controller removes, creates and chowns paths in it: in a directory a user
    # may write to, a planted link would turn those on files of the user's choosing
    from slurmrl.controller.services import UserIds

    run_dir = tmp_path / "services"
    run_dir.mkdir()
    run_dir.chmod(0o777)
    spec = ServiceSpec(7, "rollout", pwd.getpwuid(ME).pw_name, (0,))
    launcher = ServiceLauncher(None, run_dir)  # type: ignore[arg-type]
    with pytest.raises(ServiceLaunchError, match="no one else may write to"):
        launcher._prepare_dir(1, spec, UserIds.lookup(ME))
    assert list(run_dir.iterdir()) == []  # nothing made in it
    run_dir.chmod(0o755)
    work = launcher._prepare_dir(1, spec, UserIds.lookup(ME))
    assert work.parent == run_dir and oct(run_dir.stat().st_mode & 0o777) == "0o711"


def test_services_are_advertised_at_the_nodes_slurm_address(tmp_path: Path) -> None:
    # a node's name need not resolve (the dev cluster's n2 does not): a service is
    # reached where Slurm reaches the node, its NodeAddr; by name where Slurm gives none
    from slurmrl.slurm import NodeInfo, SlurmError

    class Nodes:
        calls = 0
        fail = False

        def nodes(self) -> list[NodeInfo]:
            self.calls += 1
            if self.fail:
                raise SlurmError("slurmctld down")
            return [NodeInfo("n2", "IDLE", 2, 8, 4000, ("spread",), "10.0.0.2"),
                    NodeInfo("old", "IDLE", 2, 8, 4000, ("spread",))]

    slurm = Nodes()
    launcher = ServiceLauncher(slurm, tmp_path)  # type: ignore[arg-type]
    assert launcher.address_of("n2") == "10.0.0.2"
    assert launcher.address_of("old") == "old"
    assert launcher.address_of("n2") == "10.0.0.2" and slurm.calls == 2  # kept
    slurm.fail = True
    assert launcher.address_of("n9") == "n9"  # Slurm unreachable: by name


def test_a_root_controller_runs_no_service_as_root(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # the controller's: root (CI's too)
    launcher = ServiceLauncher(None, tmp_path)  # type: ignore[arg-type]
    spec = ServiceSpec(7, "rollout", "root", (0,), uid=0)
    with pytest.raises(ServiceLaunchError, match="slurmrl runs no service as root"):
        launcher.launch(1, "node", spec, "s" * 32)
    assert list(tmp_path.iterdir()) == []


class _Step:
    """A launched step that answers, but whose answer is not a worker's."""

    killed = False

    def poll(self) -> int | None:
        return None

    def step_id(self, slurm: object) -> str:
        return "3"

    def kill(self) -> None:
        self.killed = True


def test_a_step_whose_status_is_not_a_workers_is_killed_not_left_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the pid came from the service (the job user's code): an answer without one used
    # to escape after the step's guard, leaving it running on the pool's GPUs untracked
    from slurmrl.controller import services

    step = _Step()

    class Slurm:
        def launch_step(self, *args: object, **kwargs: object) -> _Step:
            return step

        def nodes(self) -> list[object]:
            return []

    run_dir = tmp_path / "services"
    launcher = ServiceLauncher(Slurm(), run_dir, launch_attempts=1)  # type: ignore[arg-type]
    monkeypatch.setattr(launcher, "_await_address", lambda *a, **k: "127.0.0.1:1/0123456789abcdef")
    monkeypatch.setattr(launcher, "_await_status", lambda *a, **k: {"pid": "not-a-pid"})
    monkeypatch.setattr(launcher, "_kill", lambda s: s.kill())
    monkeypatch.setattr(services, "worker_argv", lambda *a, **k: ["true"])
    # an ordinary account: a root controller runs no service as root
    who = pwd.getpwnam("nobody") if ME == 0 else pwd.getpwuid(ME)
    spec = ServiceSpec(7, "rollout", who.pw_name, (0,), uid=who.pw_uid)
    with pytest.raises(ServiceLaunchError, match="not a process id"):
        launcher.launch(1, "node", spec, "s" * 32)
    assert step.killed


def test_a_services_directory_under_a_directory_others_control_is_refused(
        tmp_path: Path) -> None:
    # a user who may write to its parent could swap `services` for a link between the
    # check and the controller's chmod/chown/unlink in it
    from slurmrl.controller.services import UserIds

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # writable by all, not sticky
    spec = ServiceSpec(7, "rollout", pwd.getpwuid(ME).pw_name, (0,))
    launcher = ServiceLauncher(None, shared / "services")  # type: ignore[arg-type]
    with pytest.raises(ServiceLaunchError,
                       match=f"{shared} is another user's, or others may write to it"):
        launcher._prepare_dir(1, spec, UserIds.lookup(ME))
    shared.chmod(0o1777)  # sticky, as /tmp: others cannot rename root's entries
    work = launcher._prepare_dir(1, spec, UserIds.lookup(ME))
    assert work.parent == shared / "services"


def test_a_root_owned_link_above_the_services_directory_is_trusted(tmp_path: Path) -> None:
    # /var/lib/slurmrl -> /data/slurmrl, an automounted /shared -> /net/...: a link of
    # the controller's in a directory no one else may write to cannot be repointed
    from slurmrl.controller.services import check_run_dir

    (tmp_path / "data").mkdir()
    (tmp_path / "varlib").symlink_to(tmp_path / "data")
    check_run_dir(tmp_path / "varlib" / "services")
    assert (tmp_path / "data" / "services").is_dir()
    # ... and a link into a directory others may write to is not
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)
    (tmp_path / "to-open").symlink_to(tmp_path / "open")
    with pytest.raises(ServiceLaunchError, match="others may write to it"):
        check_run_dir(tmp_path / "to-open" / "services")


def test_a_service_step_is_named_after_its_record_and_only_such_names_are_read_back(
        ) -> None:
    from slurmrl.controller.services import service_of_step

    spec = ServiceSpec(7, "rollout", "alice", (0,), replica=2, service_id=41)
    assert spec.step_name == "slurmrl-41-job7-rollout2"
    assert service_of_step(spec.step_name) == 41
    assert ServiceSpec(7, "trainer", "alice", (0,)).step_name is None  # not recorded
    # a driver's steps, an older release's (named after the program), look-alikes
    for other in ("python3", "slurmrl-41", "slurmrl-x-job7-rollout", "batch",
                  "slurmrl-41-job7-rollout;rm", "my-slurmrl-41-job7-rollout"):
        assert service_of_step(other) is None, other


def test_the_logs_and_work_dirs_of_pools_ended_long_ago_are_removed_and_nothing_else(
        tmp_path: Path) -> None:
    run_dir = tmp_path / "services"
    run_dir.mkdir()
    outside = tmp_path / "users-data"
    outside.write_text("keep")
    now, day = 1_000_000_000.0, 86400.0

    def made(name: str, age_days: float, *, folder: bool = False) -> Path:
        path = run_dir / name
        if folder:
            path.mkdir()
            (path / "address").write_text("n1:1/0")
            (path / "link").symlink_to(outside)  # the user's: followed by nothing
        else:
            path.write_text("service output\n")
        os.utime(path, (now - age_days * day, now - age_days * day))
        return path

    gone = [made("pool101-job7-rollout.log", 20), made("pool101-job7-rollout", 20, folder=True),
            made("pool105-job3-trainer.log", 15)]
    kept = [made("pool102-job8-trainer.log", 30),   # its allocation is held: may be live
            made("pool103-job9-rollout0.log", 2),   # ended, but written to 2 days ago
            made("notes.txt", 30), made("pool106-job1-rollout.log.bak", 30)]
    launcher = ServiceLauncher(None, run_dir)  # type: ignore[arg-type]
    removed = launcher.prune({102}, 14 * day, now=now)
    assert sorted(removed) == sorted(gone)
    assert not any(p.exists() for p in gone)
    assert all(p.exists() for p in kept)
    assert outside.read_text() == "keep"
    assert launcher.prune({102}, 14 * day, now=now) == []
    # a services directory not made yet (no service launched) is nothing to prune
    assert ServiceLauncher(None, tmp_path / "none").prune(set(), 0.0) == []  # type: ignore[arg-type]
