"""The controller URL the site gave the SPANK plugin, read from plugstack.conf.

On a login or compute node outside an RL job, `slurmrl status` and `slurmrl doctor`
have no `SLURMRL_CONTROLLER` (the plugin exports it to RL jobs only), and the site
config's `[controller] host` is the address the controller listens on (often
`0.0.0.0`, which says nothing of where it is). The plugin's `controller=URL` argument
is where drivers reach it: `controller_url` finds it, in the file slurm.conf's
`PlugStackConfig` names (default: plugstack.conf next to slurm.conf), following its
`include` lines.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from slurmrl.slurm.devices import slurm_conf_path, slurm_settings


def controller_url(env: Mapping[str, str] | None = None, slurm_conf: str = "") -> str | None:
    """The slurmrl plugin's `controller=` URL, or None (no such line, or unreadable)."""
    conf = slurm_conf_path(env, slurm_conf)
    try:
        named = slurm_settings(conf).get("plugstackconfig")
    except OSError:
        named = None
    return _find(Path(named) if named else conf.parent / "plugstack.conf", 0)


def _find(path: Path, depth: int) -> str | None:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        if words[0].lower() == "include" and len(words) > 1 and depth < 8:
            pattern = words[1] if os.path.isabs(words[1]) else str(path.parent / words[1])
            for inc in sorted(Path("/").glob(pattern.lstrip("/"))):
                found = _find(inc, depth + 1)
                if found:
                    return found
        elif (words[0] in ("required", "optional") and len(words) > 1
              and re.match(r"slurmrl\.so$", os.path.basename(words[1]))):
            for arg in words[2:]:
                if arg.startswith("controller="):
                    return arg.partition("=")[2] or None
    return None
