"""How service steps name their GPUs: read from the site's Slurm config, and applied."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmrl.slurm.devices import GLOBAL, LOCAL, detect, step_devices


def _conf(tmp_path: Path, slurm: str, cgroup: str | None = None) -> str:
    (tmp_path / "slurm.conf").write_text(slurm)
    if cgroup is not None:
        (tmp_path / "cgroup.conf").write_text(cgroup)
    return str(tmp_path / "slurm.conf")


@pytest.mark.parametrize(("slurm", "cgroup", "numbering"), [
    # confined: a step sees only its job's devices, numbered 0..n-1 (as Slurm then does)
    ("TaskPlugin=task/affinity,task/cgroup\n", "ConstrainDevices=yes\n", LOCAL),
    ("taskplugin = task/cgroup # confine\n", "constraindevices=Yes\n", LOCAL),
    # not confined: every device of the node visible, Slurm's index is CUDA's
    ("TaskPlugin=task/cgroup\n", "ConstrainCores=yes\n", GLOBAL),
    ("TaskPlugin=task/cgroup\n", None, GLOBAL),
    ("TaskPlugin=task/none\n", "ConstrainDevices=yes\n", GLOBAL),  # the dev cluster's
    ("# TaskPlugin=task/cgroup\nClusterName=x\n", "ConstrainDevices=yes\n", GLOBAL),
    # Slurm takes the plugin's short name too, and settings several to a line
    ("TaskPlugin=affinity,cgroup\n", "ConstrainDevices=yes\n", LOCAL),
    ("ProctrackType=proctrack/cgroup TaskPlugin=task/cgroup\n",
     "CgroupPlugin=autodetect ConstrainDevices=yes\n", LOCAL),
])
def test_the_numbering_is_read_from_slurm_conf_and_cgroup_conf(
        tmp_path: Path, slurm: str, cgroup: str | None, numbering: str) -> None:
    assert detect({}, _conf(tmp_path, slurm, cgroup)) == numbering


def test_an_unreadable_slurm_conf_assumes_node_wide_indices(tmp_path: Path) -> None:
    assert detect({"SLURM_CONF": str(tmp_path / "none.conf")}) == GLOBAL


def test_a_confined_step_gets_its_allocations_own_numbers() -> None:
    # a pool on Slurm's GPUs 4 and 5: under confinement the step sees them as 0 and 1,
    # and CUDA_VISIBLE_DEVICES=4 named no device at all
    assert step_devices([5], [4, 5], LOCAL) == (1,)
    assert step_devices([4, 5], [5, 4], LOCAL) == (0, 1)
    assert step_devices([5], [4, 5], GLOBAL) == (5,)
    with pytest.raises(ValueError, match=r"\[6\] are not in the allocation's \[4, 5\]"):
        step_devices([6], [4, 5], LOCAL)


def test_an_included_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "task.conf").write_text("TaskPlugin=task/cgroup\n")
    conf = _conf(tmp_path, "ClusterName=x\nInclude task.conf\n", "ConstrainDevices=yes\n")
    assert detect({}, conf) == LOCAL


def test_task_cgroup_with_an_unreadable_cgroup_conf_is_said(tmp_path: Path) -> None:
    # cgroup.conf often lives on the compute nodes only (slurmd reads it): assuming
    # "not confined" there must be said, not silent
    from slurmrl.slurm.devices import explain

    numbering, problem = explain({}, _conf(tmp_path, "TaskPlugin=task/cgroup\n"))
    assert numbering == GLOBAL and problem is not None and "cgroup.conf" in problem
