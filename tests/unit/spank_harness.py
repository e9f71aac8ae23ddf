"""Compiling the SPANK plugin into a test program, for the unit tests that run it.

A test's harness is C that defines the SPANK calls the plugin makes (stubs printing or
using this process's environment), `#include "PLUGIN"` (replaced by the plugin's path),
and a `main` driving it. gcc and spank.h are part of the setup (`make deps` installs gcc
and libslurm-dev), so a missing one fails the test rather than skipping it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parents[2] / "spank_plugin" / "slurmrl.c"
SPANK_H = Path("/usr/include/slurm/spank.h")

#: Slurm's log calls as a harness defines them: an error is printed, info is dropped
LOG_STUBS = r"""
void slurm_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	printf("ERROR: ");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
}
void slurm_info(const char *fmt, ...) { (void)fmt; }
"""


def compile_harness(tmp_path_factory: pytest.TempPathFactory, harness: str,
                    name: str) -> Path:
    """`harness` (C, its `LOG_STUBS` and `#include "PLUGIN"` in it) built as program
    `name` with warnings as errors; the test fails, naming what is missing or wrong."""
    gcc = shutil.which("gcc")
    if gcc is None or not SPANK_H.exists():
        missing = " and ".join(x for x, gone in (("gcc", gcc is None),
                                                  (str(SPANK_H), not SPANK_H.exists())) if gone)
        pytest.fail(f"{missing} missing: this test compiles the SPANK plugin; `make deps` "
                    "installs gcc and libslurm-dev (spank.h)")
    d = tmp_path_factory.mktemp("spank")
    (d / "harness.c").write_text(harness.replace("LOG_STUBS", LOG_STUBS)
                                 .replace("PLUGIN", str(PLUGIN)))
    cc = subprocess.run([gcc, "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-o",
                         str(d / name), str(d / "harness.c")], capture_output=True, text=True)
    if cc.returncode:
        pytest.fail(f"the plugin does not compile in the test harness:\n{cc.stderr}")
    return d / name
