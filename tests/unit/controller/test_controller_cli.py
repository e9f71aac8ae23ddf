"""`slurmrl controller` start-up: a bad config stops it before anything is written, and
the `[slurm]` keys reach the backend it runs Slurm through.

One fake, autouse: `slurmrl.slurm.factory.pyslurm_status` answers "pyslurm not
importable" (a test that must not ask pyslurm at all replaces it with one that fails).
Whether pyslurm is usable depends on the machine (installed or not, matching the
installed Slurm or not, a Slurm to ask for its version), so these tests fix the answer
and run no Slurm command; the real check runs on the dev cluster in
tests/integration/test_slurm_backend.py."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmrl.config import Config, load
from slurmrl.controller.cli import controller, slurm_backend
from slurmrl.slurm import BatchSpec, CommandBackend, default_backend

POOL = BatchSpec(command=("sleep", "infinity"), partition="pools", gpus=4)


def _site(tmp_path: Path, text: str) -> tuple[Path, Path]:
    db_dir = tmp_path / "state"
    site = tmp_path / "site.toml"
    site.write_text(f'[controller]\ndb_path = "{db_dir}/slurmrl.db"\n{text}')
    return site, db_dir


@pytest.fixture(autouse=True)
def no_pyslurm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever this machine has: pyslurm is not usable (and no Slurm command runs)."""
    monkeypatch.setattr("slurmrl.slurm.factory.pyslurm_status",
                        lambda env=None, timeout_s=20.0: (False, "pyslurm not importable"))


def test_bad_policy_parameters_stop_it_before_the_db_exists(tmp_path: Path) -> None:
    site, db_dir = _site(tmp_path, "[policies.params.round-robin]\nbogus = 1\n")
    res = CliRunner().invoke(controller, ["--config", str(site)])
    assert res.exit_code == 1
    assert f"{site}: policies.params.round-robin: slice policy 'round-robin': bad " \
        "parameters" in res.output
    assert not db_dir.exists()


def test_an_unusable_pyslurm_backend_stops_it_before_the_db_exists(tmp_path: Path) -> None:
    site, db_dir = _site(tmp_path, '[slurm]\nbackend = "pyslurm"\n')
    res = CliRunner().invoke(controller, ["--config", str(site)])
    assert res.exit_code == 1
    assert f"{site}: slurm.backend: the pyslurm backend was asked for but cannot be used: " \
        "pyslurm not importable" in res.output
    assert not db_dir.exists()


def test_a_port_in_use_stops_it_before_the_db_exists(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        site, db_dir = _site(tmp_path, f'host = "127.0.0.1"\nport = {port}\n')
        res = CliRunner().invoke(controller, ["--config", str(site)])
    assert res.exit_code == 1
    assert f"{site}: controller.port: cannot listen on 127.0.0.1:{port}: " in res.output
    assert "address already in use" in res.output
    assert not db_dir.exists()


def test_an_address_not_this_machines_stops_it_before_the_db_exists(tmp_path: Path) -> None:
    site, db_dir = _site(tmp_path, 'host = "192.0.2.1"\n')  # TEST-NET-1: no one's
    res = CliRunner().invoke(controller, ["--config", str(site)])
    assert res.exit_code == 1
    assert f"{site}: controller.host: cannot listen on 192.0.2.1:6829: " in res.output
    assert "cannot assign requested address" in res.output.lower()
    assert not db_dir.exists()


def test_slurm_keys_reach_the_pools_sbatch(tmp_path: Path) -> None:
    site, _ = _site(tmp_path, '[slurm]\nbackend = "command"\ncommand_timeout_s = 7.5\n'
                    'pool_account = "rl-pools"\npool_time_limit = "1-00:00:00"\n')
    b = slurm_backend(load(site, env={}))
    assert isinstance(b, CommandBackend)
    assert b.timeout_s == 7.5
    argv = b.sbatch_argv(POOL)
    assert "--account=rl-pools" in argv and "--time=1-00:00:00" in argv
    # a spec's own limit still wins
    argv = b.sbatch_argv(BatchSpec(command=("true",), time_limit_min=30))
    assert "--time=30" in argv and "--time=1-00:00:00" not in argv


def test_default_slurm_keys_add_nothing_to_sbatch() -> None:
    b = slurm_backend(Config())  # backend "auto", pyslurm unusable: the commands
    assert isinstance(b, CommandBackend)
    assert b.timeout_s == 30.0
    assert not [a for a in b.sbatch_argv(POOL) if a.startswith(("--account", "--time"))]


def test_command_backend_is_used_without_asking_pyslurm(monkeypatch: pytest.MonkeyPatch) -> None:
    def asked(env: object = None, timeout_s: float = 0.0) -> tuple[bool, str]:
        raise AssertionError("pyslurm_status called")

    monkeypatch.setattr("slurmrl.slurm.factory.pyslurm_status", asked)
    assert isinstance(default_backend({}, choice="command"), CommandBackend)
    with pytest.raises(ValueError, match="unknown Slurm backend 'rest'"):
        default_backend({}, choice="rest")


def test_a_services_directory_another_user_could_swap_stops_it_before_the_db_exists(
        tmp_path: Path) -> None:
    # it was checked only at the first service launch, long after a clean start
    open_to_all = tmp_path / "shared"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    site, db_dir = _site(tmp_path, f'[services]\nrun_dir = "{open_to_all}/services"\n')
    res = CliRunner().invoke(controller, ["--config", str(site), "--pool-manager", "slurm"])
    assert res.exit_code == 1
    assert f"{site}: services.run_dir: services directory {open_to_all}/services: " \
        f"{open_to_all} is another user's, or others may write to it" in res.output
    assert not db_dir.exists()


def test_a_relative_services_dir_flag_stops_it_before_the_db_exists(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the pool nodes find the services directory at the same path: a relative one would
    # be the controller's working directory here and something else there
    monkeypatch.chdir(tmp_path)
    site, db_dir = _site(tmp_path, "")
    res = CliRunner().invoke(controller, ["--config", str(site), "--pool-manager", "slurm",
                                          "--services-dir", "svc"])
    assert res.exit_code == 1
    assert "command line: --services-dir: expected an absolute path, got 'svc'" in res.output
    assert not db_dir.exists() and not Path("svc").exists()


def test_a_policy_that_cannot_be_imported_is_named_by_its_key_not_its_parameters(
        tmp_path: Path) -> None:
    site, db_dir = _site(tmp_path, '[policies]\nslice = "no_such_site_module:Slice"\n'
                         '[policies.params."no_such_site_module:Slice"]\nk = 1\n')
    res = CliRunner().invoke(controller, ["--config", str(site)])
    assert res.exit_code == 1
    assert f"{site}: policies.slice: slice policy 'no_such_site_module:Slice' cannot be " \
        "imported" in res.output, res.output
    assert not db_dir.exists()


def test_a_slurm_conf_that_cannot_be_read_stops_it_before_the_db_exists(
        tmp_path: Path) -> None:
    # every Slurm command retried for a minute on it, while the controller ran blind
    site, db_dir = _site(tmp_path, f'[slurm]\nslurm_conf = "{tmp_path}/no/slurm.conf"\n')
    res = CliRunner().invoke(controller, ["--config", str(site)])
    assert res.exit_code == 1
    assert f"{site}: slurm.slurm_conf: {tmp_path}/no/slurm.conf is not a readable file" \
        in res.output
    assert not db_dir.exists()


def test_a_pool_manager_without_slurms_commands_stops_it_before_the_db_exists(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    for name in ("sbatch", "squeue"):  # some, not all
        (bare / name).write_text("#!/bin/sh\n")
        (bare / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(bare))
    site, db_dir = _site(tmp_path, f'[services]\nrun_dir = "{tmp_path}/svc"\n')
    res = CliRunner().invoke(controller, ["--config", str(site), "--pool-manager", "slurm"])
    assert res.exit_code == 1
    assert "PATH: the Slurm commands scancel, scontrol, sinfo, srun are not on the " \
        "controller's PATH" in res.output, res.output
    assert not db_dir.exists()


@pytest.mark.parametrize("where", ["a directory", "a file that is no DB"])
def test_a_db_path_it_cannot_open_is_named_by_its_key(tmp_path: Path, where: str) -> None:
    # an OSError ("[Errno 21] Is a directory") said nothing of which setting was wrong
    db = tmp_path / "db"
    if where == "a directory":
        db.mkdir()
    else:
        db.write_bytes(b"not sqlite at all, but long enough to be read as a header" * 4)
    with socket.create_server(("127.0.0.1", 0)) as free:
        port = free.getsockname()[1]
    site = tmp_path / "site.toml"
    site.write_text(f'[controller]\ndb_path = "{db}"\nhost = "127.0.0.1"\nport = {port}\n')
    res = CliRunner().invoke(controller, ["--config", str(site)])
    assert res.exit_code == 1
    assert f"{site}: controller.db_path: cannot open the DB '{db}': " in res.output, res.output
