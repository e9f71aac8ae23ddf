"""default_backend(): pyslurm when a matching pyslurm imports, else the command line.

pyslurm is built against exactly one Slurm major.minor (PyPI's 25.11 refuses any other
at build time), so a pyslurm whose version does not match the running Slurm is never
used. The choice and its reason are logged at INFO.
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Mapping

from slurmrl.slurm.backend import SlurmBackend
from slurmrl.slurm.command import CommandBackend
from slurmrl.slurm.types import SlurmError

log = logging.getLogger(__name__)


def pyslurm_status(env: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """(usable, reason): whether pyslurm imports and matches the installed Slurm."""
    try:
        ps = importlib.import_module("pyslurm")
    except Exception as e:  # ImportError, or a libslurm ABI error at load
        return False, f"pyslurm not importable ({type(e).__name__}: {e})"
    raw = getattr(ps, "__version__", "")
    m = re.match(r"(\d+)\.(\d+)", str(raw))
    if not m:
        return False, f"pyslurm version {raw!r} not understood"
    try:
        slurm = CommandBackend(env).version()
    except SlurmError as e:
        return False, f"cannot read the installed Slurm version: {e}"
    py_mm = (int(m.group(1)), int(m.group(2)))
    if py_mm != slurm[:2]:
        return False, (f"version mismatch: pyslurm {py_mm[0]}.{py_mm[1]} vs Slurm "
                       f"{slurm[0]}.{slurm[1]:02d}")
    return True, f"pyslurm {raw} matches Slurm {slurm[0]}.{slurm[1]:02d}"


def default_backend(env: Mapping[str, str] | None = None, *,
                    prefer_pyslurm: bool = True) -> SlurmBackend:
    """The backend to use: PyslurmBackend when usable, else CommandBackend."""
    if prefer_pyslurm:
        ok, why = pyslurm_status(env)
        if ok:
            from slurmrl.slurm.pyslurm_backend import PyslurmBackend

            log.info("Slurm backend: pyslurm (%s)", why)
            return PyslurmBackend(env)
        log.info("Slurm backend: command line (%s)", why)
    return CommandBackend(env)
