"""`dev-cluster up` installs what dpkg does not report installed (real dpkg-query)."""

from __future__ import annotations

import pytest

from slurmrl.devcluster import host


@pytest.mark.parametrize(("status", "installed"), [
    ("install ok installed", True),
    ("hold ok installed", True),
    # dpkg knows the package from the archive index but it is not on the machine: the
    # case that once let `up` skip libslurm-dev and fail building the SPANK plugin
    ("unknown ok not-installed", False),
    ("deinstall ok config-files", False),
    ("install ok half-configured", False),
    ("", False),
])
def test_only_the_installed_state_counts(status: str, installed: bool) -> None:
    assert host.is_installed(status) is installed


def test_missing_packages_asks_dpkg() -> None:
    missing = host.missing_packages(["dpkg", "slurmrl-no-such-package"])
    assert missing == ["slurmrl-no-such-package"]
