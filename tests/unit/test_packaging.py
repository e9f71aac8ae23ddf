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


def test_every_doc_is_installed_where_the_systemd_unit_points() -> None:
    # docs/*.md go to <prefix>/share/doc/slurmrl; the unit's Documentation= names one of
    # them under the venv docs/install.md installs slurmrl into
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = {Path(line.strip()).name for line in
              cfg["options.data_files"]["share/doc/slurmrl"].splitlines() if line.strip()}
    assert listed == {p.name for p in (ROOT / "docs").glob("*.md")}
    unit = (ROOT / "site-configs" / "slurmrl-controller.service").read_text()
    (doc,) = [line.split("=", 1)[1] for line in unit.splitlines()
              if line.startswith("Documentation=")]
    prefix = "file:///opt/slurmrl/venv/share/doc/slurmrl/"
    assert doc.startswith(prefix) and doc.removeprefix(prefix) in listed
    assert "python3.11 -m venv /opt/slurmrl/venv" in (ROOT / "docs" / "install.md").read_text()
