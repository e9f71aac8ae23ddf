"""How a step names its allocation's GPUs: Slurm's node-wide indices, or 0..n-1.

A service step pins its GPUs with `CUDA_VISIBLE_DEVICES` (`CommandBackend.srun_argv`).
On a node where Slurm confines each job to its own GPUs (`TaskPlugin` with
`task/cgroup` and `ConstrainDevices=yes` in cgroup.conf) a step sees only its job's
devices, and CUDA numbers them 0..n-1 in PCI order, as Slurm itself does then: index
`IDX:4` of `scontrol -d` is the step's device 0. Without confinement (the dev cluster:
`task/none`) every device of the node is visible and Slurm's index is CUDA's.

`detect` reads the site's slurm.conf and cgroup.conf (next to it) where the controller
can; `[slurm] device_numbering` overrides it. Known limit: a configless site
(`SlurmctldParameters=enable_configless`) has no slurm.conf on the controller's host:
`detect` then assumes node-wide indices and says so; set the key. A worker's NVML
readings pick devices by the same numbers; whether NVML, under confinement, enumerates
only the job's devices (so that they match) was not checked: no cluster here confines
devices, and no GPU path has run.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

GLOBAL, LOCAL = "global", "local"
NUMBERINGS = ("auto", GLOBAL, LOCAL)


def slurm_settings(path: Path, depth: int = 0) -> dict[str, str]:
    """`Key=Value` settings of a Slurm config file, keys lowercased (Slurm's are
    case-insensitive), comments dropped, several on a line, `Include FILE` followed
    (relative to this file's directory; globs too); the last of a key given twice."""
    out: dict[str, str] = {}
    for line in path.read_text(errors="replace").splitlines():
        line = line.split("#", 1)[0].strip()
        inc = re.match(r"include\s+(\S+)$", line, re.IGNORECASE)
        if inc and depth < 8:
            for name in sorted(path.parent.glob(inc.group(1))) if not os.path.isabs(
                    inc.group(1)) else sorted(Path("/").glob(inc.group(1).lstrip("/"))):
                out.update(slurm_settings(name, depth + 1))
            continue
        for key, value in re.findall(r"([A-Za-z]+)\s*=\s*(\"[^\"]*\"|\S+)", line):
            out[key.lower()] = value.strip('"')
    return out


def slurm_conf_path(env: Mapping[str, str] | None = None, slurm_conf: str = "") -> Path:
    """The site's slurm.conf: `slurm_conf` ([slurm] slurm_conf), else `$SLURM_CONF`,
    else Slurm's default path."""
    environ = os.environ if env is None else env
    return Path(slurm_conf or environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")


def _plugins(value: str) -> set[str]:
    """TaskPlugin's plugins by their short names (Slurm takes `task/cgroup` and
    `cgroup` alike)."""
    return {p.strip().removeprefix("task/") for p in value.split(",") if p.strip()}


def detect(env: Mapping[str, str] | None = None, slurm_conf: str = "") -> str:
    """`LOCAL` where slurm.conf's TaskPlugin has task/cgroup and cgroup.conf says
    ConstrainDevices=yes, else `GLOBAL` (also where the files cannot be read: logged)."""
    numbering, problem = explain(env, slurm_conf)
    if problem:
        log.warning("%s: services get Slurm's node-wide GPU indices; set [slurm] "
                    "device_numbering where jobs are confined to their devices", problem)
    return numbering


def explain(env: Mapping[str, str] | None = None, slurm_conf: str = ""
            ) -> tuple[str, str | None]:
    """(`detect`'s answer, why it could not read the site's config, or None)."""
    conf = slurm_conf_path(env, slurm_conf)
    try:
        plugins = slurm_settings(conf).get("taskplugin", "")
    except OSError as exc:
        return GLOBAL, f"cannot read {conf} ({exc.strerror or exc})"
    if "cgroup" not in _plugins(plugins):
        return GLOBAL, None
    cgroup = conf.parent / "cgroup.conf"
    try:
        constrain = slurm_settings(cgroup).get("constraindevices", "no")
    except OSError as exc:  # often on compute nodes only: slurmd reads it, not slurmctld
        return GLOBAL, (f"TaskPlugin has task/cgroup but {cgroup} cannot be read "
                        f"({exc.strerror or exc}); assuming ConstrainDevices=no")
    return (LOCAL if constrain.lower() in ("yes", "true", "1") else GLOBAL), None


def step_devices(wanted: Sequence[int], allocation: Sequence[int], numbering: str
                 ) -> tuple[int, ...]:
    """The `CUDA_VISIBLE_DEVICES` of a step that wants Slurm's GPUs `wanted` of an
    allocation holding `allocation` (Slurm's indices on the node)."""
    if numbering == GLOBAL:
        return tuple(wanted)
    order = sorted(allocation)
    missing = [g for g in wanted if g not in order]
    if missing:
        raise ValueError(f"GPU(s) {missing} are not in the allocation's {order}")
    return tuple(order.index(g) for g in wanted)
