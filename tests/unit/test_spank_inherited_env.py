"""A job submitted from inside an RL job takes none of its directives (docs/user-guide.md).

Such a job inherits, through sbatch's environment, the parent's SLURMRL_* variables, the
SLURM_SPANK_SLURMRL_* copies of its job control env and the options' copies. The plugin is
compiled with gcc against spank.h into a small program whose process environment stands
for the step's (remote context) or sbatch's (allocator context), as in
test_spank_controller_url.py; it prints what of those variables is left.
tests/integration/test_spank.py runs the same case through sbatch on the dev cluster.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from spank_harness import compile_harness

import slurmrl.client.job as client_job
from slurmrl.directives import DirectiveError, parse_env

HARNESS = r"""
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <slurm/spank.h>

extern char **environ;
static spank_context_t ctx;

LOG_STUBS
spank_context_t spank_context(void) { return ctx; }
spank_err_t spank_option_register(spank_t sp, struct spank_option *opt)
{ (void)sp; (void)opt; return ESPANK_SUCCESS; }
const char *spank_strerror(spank_err_t e) { (void)e; return "error"; }
spank_err_t spank_setenv(spank_t sp, const char *n, const char *v, int o)
{ (void)sp; return setenv(n, v, o) ? ESPANK_ERROR : ESPANK_SUCCESS; }
spank_err_t spank_unsetenv(spank_t sp, const char *n)
{ (void)sp; return unsetenv(n) ? ESPANK_ERROR : ESPANK_SUCCESS; }
/* sbatch and salloc: the job control env goes into their environment as SLURM_SPANK_* */
spank_err_t spank_job_control_setenv(spank_t sp, const char *n, const char *v, int o)
{
	char var[256];

	(void)sp;
	snprintf(var, sizeof(var), "SLURM_SPANK_%s", n);
	return setenv(var, v, o) ? ESPANK_ERROR : ESPANK_SUCCESS;
}
spank_err_t spank_getenv(spank_t sp, const char *n, char *buf, int len)
{
	const char *v = getenv(n);

	(void)sp;
	if (v == NULL)
		return ESPANK_ENV_NOEXIST;
	if ((int)strlen(v) >= len)
		return ESPANK_NOSPACE;
	strcpy(buf, v);
	return ESPANK_SUCCESS;
}

#include "PLUGIN"

/* argv: remote|allocator, then the job's own options as NAME=VALUE */
int main(int argc, char **argv)
{
	char *a[] = { "controller=http://ctl:6829" };
	int i, j;

	ctx = strcmp(argv[1], "remote") == 0 ? S_CTX_REMOTE : S_CTX_ALLOCATOR;
	/* HARNESS_NO_CONTROLLER: plugstack.conf names no controller= */
	if (slurm_spank_init(NULL, getenv("HARNESS_NO_CONTROLLER") ? 0 : 1, a) < 0)
		return 1;
	for (i = 2; i < argc; i++) {
		char *eq = strchr(argv[i], '=');

		*eq = '\0';
		for (j = 0; strcmp(options[j].name, argv[i]); j++)
			;
		if (options[j].cb(options[j].val, eq + 1, ctx == S_CTX_REMOTE) < 0)
			return 1;
	}
	if (slurm_spank_init_post_opt(NULL, 0, NULL) < 0)
		return 1;
	if (slurm_spank_user_init(NULL, 0, NULL) < 0)
		return 1;
	for (i = 0; environ[i] != NULL; i++)
		printf("%s\n", environ[i]);
	return 0;
}
"""

#: what the environment of an RL job (sbatch --rl-gpus=4 --rl-model=big --rl-group=outer)
#: holds of its directives, as a job submitted from inside it inherits them
PARENT = {
    "SLURMRL_GPUS": "4", "SLURMRL_MUX": "auto", "SLURMRL_LAYOUT": "colocated",
    "SLURMRL_MODEL": "big", "SLURMRL_GROUP": "outer",
    "SLURMRL_CONTROLLER": "http://ctl:6829",
    "SLURM_SPANK_SLURMRL_GPUS": "4", "SLURM_SPANK_SLURMRL_MUX": "auto",
    "SLURM_SPANK_SLURMRL_LAYOUT": "colocated", "SLURM_SPANK_SLURMRL_MODEL": "big",
    "SLURM_SPANK_SLURMRL_GROUP": "outer", "SLURM_SPANK_SLURMRL_CONTROLLER": "http://ctl:6829",
}
#: the options' copies (sbatch forgets them, as a child submitted with sbatch has none)
OPTION_COPIES = {f"{prefix}slurmrl_rl_{k}": v
                 for prefix in ("SLURM_SPANK__SLURM_SPANK_OPTION_", "_SLURM_SPANK_OPTION_")
                 for k, v in (("gpus", "4"), ("group", "outer"), ("model", "big"))}


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_harness(tmp_path_factory, HARNESS, "env")


def _env_after(plugin: Path, context: str, env: dict[str, str], *options: str) -> dict[str, str]:
    """The plugin's variables left in the step's (or sbatch's) environment."""
    proc = subprocess.run([str(plugin), context, *options], env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pairs = (line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    return {k: v for k, v in pairs
            if k.startswith(("SLURMRL_", "SLURM_SPANK_", "_SLURM_SPANK_OPTION_"))}


def _registered_env(monkeypatch: pytest.MonkeyPatch, step_env: dict[str, str]) -> Any:
    """What `slurmrl.connect()` in that step sends the controller (no controller called)."""
    sent: dict[str, Any] = {}

    def fake_job(job_id: int, url: str, env: dict[str, str], **_: Any) -> None:
        sent.update(job_id=job_id, env=env)

    monkeypatch.setattr(client_job, "Job", fake_job)
    client_job.connect({"SLURM_JOB_ID": "77", **step_env})
    return sent["env"]


def test_a_plain_job_from_inside_an_rl_job_gets_none_of_its_variables_in_its_steps(
    plugin: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    step = _env_after(plugin, "remote", PARENT)
    # only the site's controller URL stays (a user may set it for `slurmrl status`)
    assert step == {"SLURMRL_CONTROLLER": "http://ctl:6829"}
    # the child's driver is told it is no RL job, not the salloc message, and is not
    # registered with its parent's request
    env = _registered_env(monkeypatch, step)
    assert env == {}
    with pytest.raises(DirectiveError, match="not an RL job"):
        parse_env(env)


def test_an_rl_job_from_inside_an_rl_job_gets_only_its_own_variables(plugin: Path) -> None:
    step = _env_after(plugin, "remote", PARENT, "rl-gpus=2", "rl-group=mine")
    own = {k: v for k, v in step.items() if k.startswith("SLURMRL_")}
    assert own == {"SLURMRL_GPUS": "2", "SLURMRL_MUX": "auto", "SLURMRL_LAYOUT": "colocated",
                   "SLURMRL_GROUP": "mine", "SLURMRL_CONTROLLER": "http://ctl:6829"}


def test_sbatch_of_a_plain_job_inside_an_rl_job_passes_none_of_its_variables_on(
    plugin: Path,
) -> None:
    # what sbatch (or salloc, whose shell no step plugin sees) hands the new job
    assert _env_after(plugin, "allocator", {**PARENT, **OPTION_COPIES}) == {
        "SLURMRL_CONTROLLER": "http://ctl:6829"}


def test_sbatch_of_an_rl_job_inside_an_rl_job_passes_only_its_own_on(plugin: Path) -> None:
    env = _env_after(plugin, "allocator", {**PARENT, **OPTION_COPIES}, "rl-gpus=2",
                     "rl-model=small")
    assert env == {"SLURM_SPANK_SLURMRL_GPUS": "2", "SLURM_SPANK_SLURMRL_MUX": "auto",
                   "SLURM_SPANK_SLURMRL_LAYOUT": "colocated",
                   "SLURM_SPANK_SLURMRL_MODEL": "small",
                   "SLURM_SPANK_SLURMRL_CONTROLLER": "http://ctl:6829",
                   "SLURMRL_CONTROLLER": "http://ctl:6829"}


def test_a_step_of_an_rl_job_submitted_with_export_none_keeps_its_directives(
    plugin: Path,
) -> None:
    # --export=NONE: only SLURM* variables, from which the step reads its options
    own = {k: v for k, v in OPTION_COPIES.items() if k.startswith("SLURM_SPANK__")}
    step = _env_after(plugin, "remote", {**own, "SLURM_SPANK_SLURMRL_GPUS": "4"})
    assert (step["SLURMRL_GPUS"], step["SLURMRL_GROUP"], step["SLURMRL_MODEL"]) == (
        "4", "outer", "big")


def test_a_controller_url_the_user_set_reaches_a_plain_jobs_steps(plugin: Path) -> None:
    mine = {"SLURMRL_CONTROLLER": "http://ctl.example:6829"}
    assert _env_after(plugin, "allocator", mine) == mine
    assert _env_after(plugin, "remote", mine) == mine


def test_an_rl_job_keeps_the_users_controller_url_where_the_site_names_none(
    plugin: Path,
) -> None:
    # plugstack.conf without controller=: the RL job's steps dropped the user's URL, and
    # its driver waited minutes on the default address before failing
    mine = {"SLURMRL_CONTROLLER": "http://ctl.example:6829", "HARNESS_NO_CONTROLLER": "1"}
    step = _env_after(plugin, "remote", mine, "rl-gpus=2")
    assert step["SLURMRL_CONTROLLER"] == "http://ctl.example:6829"
    assert step["SLURMRL_GPUS"] == "2"
    # where the site names one, the RL job's steps take the site's
    site = _env_after(plugin, "remote", {"SLURMRL_CONTROLLER": "http://ctl.example:6829"},
                      "rl-gpus=2")
    assert site["SLURMRL_CONTROLLER"] == "http://ctl:6829"
