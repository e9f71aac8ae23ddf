"""`controller.hide_other_users`: a site that hides who runs what.

rlbob's RL job is registered. With the setting on, rlalice's `slurmrl status` shows the
job without bob's name ("-"), `-u rlbob` finds nothing, and the job's public view has
`user: null`; root (an admin) still sees the name. With it off (the default) she sees it.
"""

from __future__ import annotations

import json
import pwd
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.controller_harness import (
    VENV_PY,
    ControllerProc,
    env_for_controller,
    wait_output,
)

REGISTER = '''
import sys, time, slurmrl
job = slurmrl.connect(url=sys.argv[1])
print("registered", job.job_id, flush=True)
time.sleep(600)
'''


def _controller(tmp: Path, env: dict[str, str], hide: bool) -> ControllerProc:
    env = env_for_controller(env)
    env["SLURMRL_CONTROLLER__HIDE_OTHER_USERS"] = "true" if hide else "false"
    ctl = ControllerProc(tmp, env, lease_timeout_s=30.0)
    ctl.start()
    return ctl


@pytest.fixture(params=[True, False], ids=["hidden", "shown"])
def hidden(request: pytest.FixtureRequest, shared_tmp: Path,
           slurm_env: dict[str, str]) -> Iterator[tuple[bool, ControllerProc]]:
    ctl = _controller(shared_tmp, slurm_env, request.param)
    yield request.param, ctl
    ctl.stop()


def test_a_site_can_hide_other_users_names(hidden: tuple[bool, ControllerProc], jobs,  # type: ignore[no-untyped-def]
                                           shared_tmp: Path) -> None:
    hide, controller = hidden
    script = shared_tmp / "register.py"
    script.write_text(REGISTER)
    script.chmod(0o644)
    out = shared_tmp / f"bob-{hide}.out"
    sub = jobs.sbatch(["--rl-gpus=1", f"--output={out}", "--time=5",
                       f"--wrap={VENV_PY} {script} {controller.url}"], user="rlbob")
    assert sub.job_id, sub.stderr
    bob = sub.job_id
    wait_output(out, "registered")

    def status(*args: str, user: str | None = "rlalice") -> Any:
        proc = jobs.run([VENV_PY, "-m", "slurmrl.cli.main", "status", "--controller",
                         controller.url, *args], user=user)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    table = status("-j", str(bob), "-o", "jobid,user")
    row = [line.split() for line in table.splitlines() if line.split()[:1] == [str(bob)]]
    assert row == [[str(bob), "-" if hide else "rlbob"]], table

    by_name = json.loads(status("--json", "-u", "rlbob"))
    assert [j["job_id"] for j in by_name["jobs"]] == ([] if hide else [bob])
    everyone = json.loads(status("--json"))
    seen = [j for j in everyone["jobs"] if j["job_id"] == bob]
    assert seen and seen[0]["user"] == (None if hide else "rlbob")
    assert seen[0]["uid"] == (None if hide else pwd.getpwnam("rlbob").pw_uid)

    # an admin always sees who it is
    as_root = json.loads(status("--json", "-u", "rlbob", user=None))
    assert [(j["job_id"], j["user"]) for j in as_root["jobs"]] == [(bob, "rlbob")]
