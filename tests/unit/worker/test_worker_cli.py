"""`slurmrl worker` argument handling: the secret never comes from argv."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from slurmrl.auth.tokens import mint_secret
from slurmrl.cli.main import cli
from slurmrl.worker.cli import SECRET_ENV, read_secret
from slurmrl.worker.handle import ServiceHandle, ServiceUnauthorized
from slurmrl.worker.handoff import prepare_dir


def test_secret_from_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "s"
    path.write_text(mint_secret() + "\n")
    path.chmod(0o600)
    assert read_secret(path) == path.read_text().strip()


def test_group_readable_secret_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s"
    path.write_text(mint_secret())
    path.chmod(0o640)
    with pytest.raises(click.UsageError, match="chmod 600"):
        read_secret(path)
    with pytest.raises(click.UsageError, match="No such file"):
        read_secret(tmp_path / "missing")


def test_secret_from_env_is_removed_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SECRET_ENV, "s" * 32)
    assert read_secret(None) == "s" * 32
    assert SECRET_ENV not in os.environ  # children of the worker do not inherit it


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ([], {SECRET_ENV: ""}, "no job secret"),
        ([], {SECRET_ENV: "short"}, "at least 16 bytes"),
        (["--backend", "torch", "--role", "rollout"], None, "torch backend is a trainer"),
        (["--backend", "sglang"], None, "'sglang' is not one of"),
        (["--log-level", "FOO"], None, "'FOO' is not one of 'debug', 'info'"),
    ],
)
def test_usage_errors_exit_2_with_a_message(
    args: list[str], env: dict[str, str] | None, message: str
) -> None:
    base = {"--backend": "tiny", "--role": "rollout", "--job-id": "9"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    argv = ["worker", *[x for kv in base.items() for x in kv]]
    result = CliRunner().invoke(cli, argv, env=env or {SECRET_ENV: mint_secret()})
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_a_missing_handoff_dir_is_created_private(tmp_path: Path) -> None:
    path = prepare_dir(tmp_path / "slurmrl-job9-abc")
    assert path.is_dir() and stat.S_IMODE(path.stat().st_mode) == 0o700
    assert prepare_dir(path) == path  # an existing private one is fine


def _handoff_refusals(tmp_path: Path) -> list[tuple[Path, str]]:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)  # even to a good directory: the link itself could be changed
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o770)
    readable = tmp_path / "readable"
    readable.mkdir()
    readable.chmod(0o705)
    a_file = tmp_path / "file"
    a_file.write_text("")
    cases = [(link, "is a symlink"), (shared, "accessible to group or others"),
             (readable, "accessible to group or others"), (a_file, "is not a directory"),
             (tmp_path / "no" / "parent", "cannot create handoff dir")]
    if os.geteuid() == 0:  # only root can give a directory away
        other = tmp_path / "other"
        other.mkdir(mode=0o700)
        os.chown(other, 65534, 65534)
        cases.append((other, "owned by uid 65534, not by this worker's uid 0"))
    return cases


def test_a_handoff_dir_that_is_not_private_is_refused(tmp_path: Path) -> None:
    cases = _handoff_refusals(tmp_path)
    assert os.geteuid() != 0 or len(cases) == 6  # the tests run as root: all checked
    for path, message in cases:
        with pytest.raises(ValueError, match=message) as err:
            prepare_dir(path)
        assert str(path) in str(err.value)
    assert (tmp_path / "real").stat().st_mode & 0o777 == 0o700  # nothing was changed
    assert (tmp_path / "shared").stat().st_mode & 0o777 == 0o770


def test_the_worker_refuses_to_start_with_such_a_handoff_dir(tmp_path: Path) -> None:
    for path, message in _handoff_refusals(tmp_path):
        argv = ["worker", "--backend", "tiny", "--role", "trainer", "--job-id", "9",
                "--handoff-dir", str(path)]
        result = CliRunner().invoke(cli, argv, env={SECRET_ENV: mint_secret()})
        assert result.exit_code == 2, result.output
        assert "--handoff-dir" in result.output and message in result.output
        assert str(path) in result.output.replace("\n", "")


def test_a_model_that_fails_to_load_is_a_one_line_error(tmp_path: Path) -> None:
    # a factory that raises (here: called with no argument) used to print a traceback
    argv = ["worker", "--backend", "torch", "--model", "json:loads", "--device", "cpu",
            "--role", "trainer", "--job-id", "9", "--host", "127.0.0.1"]
    result = CliRunner().invoke(cli, argv, env={SECRET_ENV: mint_secret()})
    assert result.exit_code == 1, result.output
    assert "slurmrl worker: error: loading the model failed: TypeError" in result.output
    assert "Traceback" not in result.output


def test_an_address_file_it_cannot_write_is_named_not_taken_for_a_port(
        tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    where = tmp_path / "a-file" / "addr"  # under a file: no directory can be made there
    argv = ["worker", "--backend", "tiny", "--role", "trainer", "--job-id", "9",
            "--host", "127.0.0.1", "--address-file", str(where)]
    result = CliRunner().invoke(cli, argv, env={SECRET_ENV: mint_secret()})
    assert result.exit_code == 1, result.output
    assert f"cannot write --address-file {where}" in result.output
    assert "cannot listen" not in result.output


def test_the_worker_takes_calls_made_out_to_the_address_it_announces(
        tmp_path: Path) -> None:
    # the controller records the address file's host:port/launch and gives it to the
    # driver: that is the name a call must be made out to, not the one the worker binds
    secret = mint_secret()
    addr_file = tmp_path / "address"
    env = {**os.environ, SECRET_ENV: secret}
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurmrl.worker", "--backend", "tiny", "--role", "rollout",
         "--job-id", "9", "--host", "127.0.0.1", "--advertise-host", "localhost",
         "--address-file", str(addr_file)], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not addr_file.exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the worker did not announce itself"
            time.sleep(0.1)
        announced = addr_file.read_text().strip()
        port_launch = announced.removeprefix("localhost:")
        assert re.fullmatch(r"[0-9]+/[0-9a-f]{16}", port_launch), announced
        handle = ServiceHandle(announced, secret, "9", "rollout", timeout_s=30)
        assert handle.generate(["1+1="], max_tokens=2).samples
        bound = ServiceHandle(f"127.0.0.1:{port_launch}", secret, "9", "rollout",
                              timeout_s=30)
        with pytest.raises(ServiceUnauthorized, match=f"not to this one \\({announced}\\)"):
            bound.status()
        handle.stop()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
