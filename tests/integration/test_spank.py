"""The SPANK plugin on the real dev cluster: --rl-* through sbatch, #SBATCH lines and srun.

The cases come from tests/data/directives.toml, the same table the Python parser is
tested against, so the plugin and slurmrl.directives cannot drift apart silently.
"""

from __future__ import annotations

import tomllib
import uuid
from pathlib import Path
from typing import Any

import pytest

from slurmrl.devcluster import DevCluster
from tests.integration.conftest import JobFactory

pytestmark = pytest.mark.integration

CASES: dict[str, Any] = tomllib.loads(
    (Path(__file__).parents[1] / "data" / "directives.toml").read_text()
)
CONTROLLER = "http://127.0.0.1:6829"


def _flags(options: dict[str, str]) -> list[str]:
    return [f"--{name}={value}" for name, value in options.items()]


def _slurmrl_env(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line.startswith("SLURMRL_"))
    return {k: v for k, v in pairs}


def _run_and_read(jobs: JobFactory, args: list[str], *, user: str | None = None,
                  script: str | None = None) -> str:
    out = jobs.workdir / f"out-{uuid.uuid4().hex[:8]}.txt"
    sub = jobs.sbatch([f"--output={out}", *args], user=user, script=script)
    assert sub.returncode == 0, sub.stderr
    assert sub.job_id is not None
    assert jobs.wait(sub.job_id) in ("COMPLETED", "GONE")
    return out.read_text()


@pytest.mark.parametrize("case", CASES["invalid"],
                         ids=lambda c: "|".join(c["options"].values())[:40])
def test_malformed_directive_fails_sbatch_and_creates_no_job(
    jobs: JobFactory, case: dict[str, Any],
) -> None:
    name = f"bad-{uuid.uuid4().hex[:10]}"
    sub = jobs.sbatch([f"--job-name={name}", *_flags(case["options"]), "--wrap", "true"])
    assert sub.returncode != 0
    assert sub.job_id is None
    assert f"slurmrl: {case['message']}" in sub.stderr or case["message"] in sub.stderr
    assert jobs.jobs_named(name) == []


@pytest.mark.parametrize("case", CASES["valid"], ids=lambda c: c["name"])
def test_valid_directives_reach_the_job_as_slurmrl_env(
    jobs: JobFactory, case: dict[str, Any],
) -> None:
    out = _run_and_read(jobs, [*_flags(case["options"]), "--wrap", "env | grep ^SLURMRL_"])
    assert _slurmrl_env(out) == {**case["env"], "SLURMRL_CONTROLLER": CONTROLLER}


def test_acceptance_command_prints_the_exported_values(jobs: JobFactory) -> None:
    out = _run_and_read(jobs, ["--rl-gpus=4", "--rl-model=tiny", "--wrap",
                               "env | grep ^SLURMRL_"])
    assert "SLURMRL_GPUS=4" in out.splitlines()
    assert "SLURMRL_MODEL=tiny" in out.splitlines()


def test_sbatch_lines_in_a_script_work(jobs: JobFactory) -> None:
    script = (
        "#!/bin/bash\n"
        "#SBATCH --rl-gpus=2\n"
        "#SBATCH --rl-model=tiny\n"
        "#SBATCH --rl-profile=rollout=0.6,train=0.4\n"
        "env | grep ^SLURMRL_\n"
    )
    env = _slurmrl_env(_run_and_read(jobs, [], script=script))
    assert env["SLURMRL_GPUS"] == "2"
    assert env["SLURMRL_PROFILE"] == "rollout=0.6,train=0.4"


def test_malformed_sbatch_line_in_a_script_fails(jobs: JobFactory) -> None:
    sub = jobs.sbatch([], script="#!/bin/bash\n#SBATCH --rl-gpus=lots\ntrue\n")
    assert sub.returncode != 0
    assert "--rl-gpus=lots: expected N or TYPE:N (N an integer 1..1024" in sub.stderr


def test_srun_rejects_a_malformed_value(jobs: JobFactory) -> None:
    proc = jobs.run(["srun", "--rl-gpus=abc", "true"])
    assert proc.returncode != 0
    assert "--rl-gpus=abc: expected N or TYPE:N (N an integer 1..1024" in proc.stderr


def test_srun_steps_get_the_env_too(jobs: JobFactory) -> None:
    proc = jobs.run(["srun", "-n1", "--rl-gpus=2", "--rl-mux=off", "--rl-mem=1G",
                     "printenv"])
    assert proc.returncode == 0, proc.stderr
    env = _slurmrl_env(proc.stdout)
    assert env["SLURMRL_GPUS"] == "2"
    assert env["SLURMRL_MUX"] == "off"
    assert env["SLURMRL_MEM"] == str(2**30)


def test_a_job_of_another_user_gets_its_directives(jobs: JobFactory) -> None:
    out = _run_and_read(jobs, ["--rl-gpus=1", "--rl-group=alice", "--wrap",
                               "id -un; env | grep ^SLURMRL_"], user="rlalice")
    assert out.splitlines()[0] == "rlalice"
    assert _slurmrl_env(out)["SLURMRL_GROUP"] == "alice"


def test_a_plain_job_gets_no_slurmrl_env(jobs: JobFactory) -> None:
    out = _run_and_read(jobs, ["--wrap", "env | grep ^SLURMRL_ || echo none"])
    assert out.strip() == "none"


def test_inherited_slurmrl_variables_do_not_leak_into_an_rl_job(jobs: JobFactory) -> None:
    # e.g. a job submitted from inside another RL job
    jobs.env = {**jobs.env, "SLURMRL_GROUP": "outer", "SLURMRL_GPUS": "8"}
    env = _slurmrl_env(_run_and_read(jobs, ["--rl-gpus=2", "--wrap", "env"]))
    assert env["SLURMRL_GPUS"] == "2"
    assert "SLURMRL_GROUP" not in env


#: what an RL job's environment holds of its directives, as a job submitted from inside it
#: inherits them: its SLURMRL_* variables, the SLURM_SPANK_SLURMRL_* copies of its job
#: control env, and its options (sbatch put them all there)
PARENT_ENV = {
    **{f"{prefix}slurmrl_rl_{k}": v
       for prefix in ("SLURM_SPANK__SLURM_SPANK_OPTION_", "_SLURM_SPANK_OPTION_")
       for k, v in (("gpus", "4"), ("group", "outer"), ("model", "big"))},
    **{f"{prefix}SLURMRL_{k}": v
       for prefix in ("", "SLURM_SPANK_")
       for k, v in (("GPUS", "4"), ("MUX", "auto"), ("LAYOUT", "colocated"),
                    ("MODEL", "big"), ("GROUP", "outer"), ("CONTROLLER", CONTROLLER))},
}


def _inherited(text: str) -> dict[str, str]:
    """The variables of PARENT_ENV's names in an `env` output."""
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {k: v for k, v in pairs if k in PARENT_ENV}


def test_a_job_submitted_from_inside_an_rl_job_takes_none_of_its_directives(
        jobs: JobFactory) -> None:
    # sbatch reads the options' copies back as options, above the script's #SBATCH
    # lines: a plain job became an RL job of 4 GPUs, and a child's own directives were
    # replaced by its parent's; and a plain child kept its parent's SLURMRL_* variables,
    # so that its connect() registered it with its parent's request
    jobs.env = {**jobs.env, **PARENT_ENV}
    out = _run_and_read(jobs, ["--wrap", "env; echo STEP; srun /usr/bin/env; echo LEAK; "
                               "SLURMRL_GPUS=4 SLURM_SPANK_SLURMRL_GPUS=4 srun /usr/bin/env"])
    head, leak = out.split("LEAK\n", 1)
    batch, step = head.split("STEP\n", 1)
    for text in (batch, step, leak):  # a plain job's steps keep none, however they came
        # but the site's controller URL (which a user may set for `slurmrl status`)
        assert _inherited(text) == {"SLURMRL_CONTROLLER": CONTROLLER}
    script = "#!/bin/sh\n#SBATCH --rl-gpus=2\n#SBATCH --rl-group=mine\nenv\n"
    out = _run_and_read(jobs, [], script=script)
    env = _slurmrl_env(out)
    assert (env["SLURMRL_GPUS"], env["SLURMRL_GROUP"]) == ("2", "mine")
    assert "SLURMRL_MODEL" not in env
    assert "SLURM_SPANK_SLURMRL_MODEL" not in _inherited(out)


def test_help_lists_the_directives(jobs: JobFactory) -> None:
    proc = jobs.run(["sbatch", "--help"])
    for option in ("--rl-gpus=[TYPE:]N", "--rl-model=NAME|PATH", "--rl-mem=SIZE", "--rl-mux",
                   "--rl-group=NAME", "--rl-max-slowdown=X", "--rl-profile=SPEC",
                   "--rl-layout", "--rl-steps=N"):
        assert option in proc.stdout


def test_plugstack_conf_passes_the_controller_url(dev_cluster: DevCluster) -> None:
    text = dev_cluster.layout.plugstack_conf.read_text()
    assert f"controller={CONTROLLER}" in text
    assert str(dev_cluster.layout.plugin_so) in text


@pytest.mark.parametrize(("args", "message"), [
    ("controller=http://127.0.0.1:6829 colour=blue",
     "slurmrl: plugstack.conf: unknown argument 'colour=blue'"),
    ("controller=ftp://host",
     "slurmrl: plugstack.conf: controller=ftp://host: expected http://HOST[:PORT]"),
])
def test_bad_plugstack_arguments_are_refused_by_name(
    dev_cluster: DevCluster, jobs: JobFactory, args: str, message: str,
) -> None:
    # A private copy of the client config pointing at another plugstack.conf: sbatch loads
    # the plugin locally, so the shared cluster is not touched.
    etc = jobs.workdir / "etc"
    etc.mkdir()
    conf = dev_cluster.layout.slurm_conf.read_text().replace(
        f"PlugStackConfig={dev_cluster.layout.plugstack_conf}",
        f"PlugStackConfig={etc / 'plugstack.conf'}",
    )
    (etc / "slurm.conf").write_text(conf)
    (etc / "gres.conf").write_text(dev_cluster.layout.gres_conf.read_text())
    (etc / "plugstack.conf").write_text(f"required {dev_cluster.layout.plugin_so} {args}\n")
    jobs.env = {**jobs.env, "SLURM_CONF": str(etc / "slurm.conf")}
    name = f"ps-{uuid.uuid4().hex[:8]}"
    sub = jobs.sbatch([f"--job-name={name}", "--rl-gpus=1", "--wrap", "true"])
    assert sub.returncode != 0
    assert message in sub.stderr
    jobs.env = {**jobs.env, "SLURM_CONF": str(dev_cluster.slurm_conf)}
    assert jobs.jobs_named(name) == []


def test_an_rl_job_submitted_with_export_none_still_gets_its_directives(
        jobs: JobFactory) -> None:
    # --export=NONE keeps only SLURM* variables: the copies of the options slurmstepd
    # hands the plugin were dropped, and the job ran as no RL job (nor did its steps)
    out = _run_and_read(jobs, ["--export=NONE", "--rl-gpus=2", "--rl-group=g1", "--wrap",
                               "env; echo STEP; srun /usr/bin/env"])
    batch, step = out.split("STEP\n", 1)
    for text in (batch, step):
        env = _slurmrl_env(text)
        assert (env["SLURMRL_GPUS"], env["SLURMRL_GROUP"]) == ("2", "g1")


def test_option_without_value_swallows_the_next_word_and_fails(jobs: JobFactory) -> None:
    # getopt takes the next word as the value of --rl-gpus: the plugin refuses it by
    # name (with `--wrap` next, sbatch itself failed first: that showed nothing)
    name = f"nv-{uuid.uuid4().hex[:8]}"
    sub = jobs.sbatch([f"--job-name={name}", "--rl-gpus", "--rl-model=tiny", "--wrap",
                       "true"])
    assert sub.returncode != 0
    assert ("slurmrl: --rl-gpus=--rl-model=tiny: expected N or TYPE:N (N an integer "
            "1..1024") in sub.stderr
    assert jobs.jobs_named(name) == []
