"""`slurmrl worker` argument handling: the secret never comes from argv."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from slurmrl.auth.tokens import mint_secret
from slurmrl.cli.main import cli
from slurmrl.worker.cli import SECRET_ENV, read_secret


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
    import os

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
