"""default_backend(): pyslurm when a matching pyslurm imports, else the command line.

pyslurm is built against exactly one Slurm major.minor (PyPI's 25.11 refuses any other
at build time), so a pyslurm whose version does not match the running Slurm is never
used. The choice and its reason are logged at INFO. A site can insist on either
(`[slurm] backend = "command"` or `"pyslurm"`); insisting on an unusable pyslurm is an
error, not a silent fallback.
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


def pyslurm_status(env: Mapping[str, str] | None = None,
                   timeout_s: float = 20.0) -> tuple[bool, str]:
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
        slurm = CommandBackend(env, timeout_s=timeout_s).version()
    except SlurmError as e:
        return False, f"cannot read the installed Slurm version: {e}"
    py_mm = (int(m.group(1)), int(m.group(2)))
    if py_mm != slurm[:2]:
        return False, (f"version mismatch: pyslurm {py_mm[0]}.{py_mm[1]} vs Slurm "
                       f"{slurm[0]}.{slurm[1]:02d}")
    return True, f"pyslurm {raw} matches Slurm {slurm[0]}.{slurm[1]:02d}"


def default_backend(env: Mapping[str, str] | None = None, *, choice: str = "auto",
                    timeout_s: float = 20.0, account: str = "",
                    time_limit: str = "") -> SlurmBackend:
    """The backend to use: `choice` "command", "pyslurm", or "auto" (pyslurm if usable).

    `timeout_s` bounds each Slurm command; `account` and `time_limit` go on every
    submission (see CommandBackend). Raises SlurmError when "pyslurm" is chosen but
    cannot be used, ValueError for an unknown choice.
    """
    if choice not in ("auto", "command", "pyslurm"):
        raise ValueError(f"unknown Slurm backend {choice!r}; valid: auto, command, pyslurm")
    if choice != "command":
        ok, why = pyslurm_status(env, timeout_s)
        if ok:
            from slurmrl.slurm.pyslurm_backend import PyslurmBackend

            log.info("Slurm backend: pyslurm (%s)", why)
            return PyslurmBackend(env, timeout_s=timeout_s, account=account,
                                  time_limit=time_limit)
        if choice == "pyslurm":
            raise SlurmError(f"the pyslurm backend was asked for but cannot be used: {why}")
        log.info("Slurm backend: command line (%s)", why)
    else:
        log.info("Slurm backend: command line (as configured)")
    return CommandBackend(env, timeout_s=timeout_s, account=account, time_limit=time_limit)
