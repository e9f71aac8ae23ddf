"""What an installed copy ships beyond the Python packages."""

from __future__ import annotations

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_suite_workload_is_installed_for_slurmrl_simulate() -> None:
    # `slurmrl simulate -w NAME` outside the source tree reads
    # <prefix>/share/slurmrl/workloads: a workload added to workloads/ but not to
    # setup.cfg's data_files would be missing there
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = {Path(line.strip()).name for line in
              cfg["options.data_files"]["share/slurmrl/workloads"].splitlines() if line.strip()}
    on_disk = {p.name for p in (ROOT / "workloads").iterdir() if p.suffix in (".json", ".md")}
    assert listed == on_disk
