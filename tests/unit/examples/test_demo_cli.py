"""examples/demo.py's command line: `--help` and a bad argument answer at once and run
nothing (the demo deletes $SLURMRL_DEV_STATE/demo/* and starts a controller)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[3] / "examples" / "demo.py"


def _demo(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """demo.py with its state under `tmp_path` (a run there would delete and write only
    there) and no slurmrl install to start a controller from, should it run anyway."""
    state = tmp_path / "state"
    (state / "demo" / "dedicated").mkdir(parents=True)
    (state / "demo" / "dedicated" / "keep").write_text("a previous run's output")
    return subprocess.run(
        [sys.executable, str(DEMO), *args], capture_output=True, text=True, timeout=60,
        env={**os.environ, "SLURMRL_DEV_STATE": str(state),
             "SLURMRL_VENV": str(tmp_path / "no-venv"), **env}, check=False)


def _untouched(tmp_path: Path) -> bool:
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    return files == ["state", "state/demo", "state/demo/dedicated",
                     "state/demo/dedicated/keep"]


def test_help_describes_the_demo_and_runs_nothing(tmp_path: Path) -> None:
    res = _demo(tmp_path, "--help")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("usage: demo.py")
    for said in ("dedicated", "multiplexed", "SLURMRL_DEV_STATE", "DEMO_STEPS", "as root"):
        assert said in res.stdout, said
    assert _untouched(tmp_path)


@pytest.mark.parametrize(("args", "env", "says"), [
    (("--bogus",), {}, "unrecognized arguments: --bogus"),
    (("now",), {}, "unrecognized arguments: now"),
    ((), {"DEMO_STEPS": "ten"}, "DEMO_STEPS must be a number of steps of at least 2"),
    # one step has no first and last rewards to compare: it failed after both runs
    ((), {"DEMO_STEPS": "1"}, "(the verdict compares each job's first and last rewards), "
                              "got '1'"),
])
def test_a_usage_error_exits_2_and_runs_nothing(
        tmp_path: Path, args: tuple[str, ...], env: dict[str, str], says: str) -> None:
    res = _demo(tmp_path, *args, **env)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stdout == "" and res.stderr.startswith("usage: demo.py")
    assert says in res.stderr
    assert _untouched(tmp_path)
