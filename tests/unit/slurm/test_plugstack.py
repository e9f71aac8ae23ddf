"""The controller URL a login node finds in the SPANK plugin's plugstack.conf line."""

from __future__ import annotations

from pathlib import Path

from slurmrl.slurm.plugstack import controller_url


def test_the_plugins_controller_argument_is_found_through_includes(tmp_path: Path) -> None:
    # Debian's plugstack.conf includes plugstack.conf.d/*, where install.md puts the line
    (tmp_path / "slurm.conf").write_text("ClusterName=x\n")
    (tmp_path / "plugstack.conf").write_text("include plugstack.conf.d/*.conf\n")
    (tmp_path / "plugstack.conf.d").mkdir()
    (tmp_path / "plugstack.conf.d" / "other.conf").write_text(
        "optional /usr/lib/spank/other.so controller=http://wrong:1\n")
    (tmp_path / "plugstack.conf.d" / "slurmrl.conf").write_text(
        "# the slurmrl plugin\nrequired /usr/lib/slurm/spank/slurmrl.so "
        "controller=http://rl.example.org:6829 debug=no\n")
    url = controller_url({}, str(tmp_path / "slurm.conf"))
    assert url == "http://rl.example.org:6829"


def test_plugstackconfig_names_the_file_and_none_is_none(tmp_path: Path) -> None:
    (tmp_path / "stack.conf").write_text(
        "required /opt/slurmrl.so controller=http://10.0.0.5:7000\n")
    (tmp_path / "slurm.conf").write_text(f"PlugStackConfig={tmp_path}/stack.conf\n")
    assert controller_url({}, str(tmp_path / "slurm.conf")) == "http://10.0.0.5:7000"
    (tmp_path / "stack.conf").write_text("required /opt/slurmrl.so debug=yes\n")
    assert controller_url({}, str(tmp_path / "slurm.conf")) is None
    assert controller_url({"SLURM_CONF": str(tmp_path / "none.conf")}) is None
