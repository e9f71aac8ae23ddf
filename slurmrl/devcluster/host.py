"""Host preparation for the dev cluster: OS checks, Debian packages, test users, the plugin.

Everything here changes the machine (apt-get, useradd, gcc), so it runs as root only and
only when something is missing: a second `up` installs nothing and rebuilds nothing that is
up to date.

Known limits: Debian/Ubuntu only (apt-get, dpkg-query); the test users get plain
`useradd -m` accounts with no password.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Sequence
from pathlib import Path

#: What the dev cluster needs; --no-install-recommends keeps it to ~10 packages.
PACKAGES: tuple[str, ...] = (
    "slurmctld",
    "slurmd",
    "slurm-client",
    "munge",
    "libslurm-dev",
    "gcc",
    "libc6-dev",
    "make",
)

#: The service account that owns pools, and two RL users for tests and the demo.
SERVICE_USER = "slurmrl"
TEST_USERS: tuple[str, ...] = (SERVICE_USER, "rlalice", "rlbob")

APT_TIMEOUT_S = 900.0
BUILD_TIMEOUT_S = 120.0


class DevClusterError(RuntimeError):
    """The dev cluster cannot be brought up, stopped or queried; the message says why."""


def run_checked(argv: Sequence[str], *, timeout_s: float, what: str,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure raise DevClusterError with its stderr."""
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout_s, env=env,
            stdin=subprocess.DEVNULL, check=False,
        )
    except FileNotFoundError as exc:
        raise DevClusterError(f"{what}: {argv[0]} not found") from exc
    except subprocess.TimeoutExpired as exc:
        raise DevClusterError(
            f"{what}: `{' '.join(argv)}` timed out after {timeout_s:g} s"
        ) from exc
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip()[-2000:]
        raise DevClusterError(f"{what}: `{' '.join(argv)}` exited {proc.returncode}: {detail}")
    return proc


def check_host() -> None:
    """Refuse, readably, anything but root on Debian/Ubuntu."""
    if os.geteuid() != 0:
        raise DevClusterError(
            "the dev cluster must be managed as root (it installs packages and starts "
            "slurmctld/slurmd/munged); run it with sudo or as root"
        )
    ids = _os_release_ids()
    if not ids & {"debian", "ubuntu"}:
        found = ", ".join(sorted(ids)) or "unknown (no /etc/os-release)"
        raise DevClusterError(
            f"the dev cluster supports Debian and Ubuntu only; this system is {found}"
        )


def _os_release_ids() -> set[str]:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return set()
    ids: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key in ("ID", "ID_LIKE"):
            ids.update(value.strip().strip('"').split())
    return ids


def is_installed(status: str) -> bool:
    """Whether a dpkg `${Status}` line ("want flag state") says installed.

    A package dpkg merely knows of reads "unknown ok not-installed", one removed but not
    purged "deinstall ok config-files": only the state word "installed" counts.
    """
    words = status.split()
    return len(words) == 3 and words[2] == "installed"


def missing_packages(packages: Sequence[str] = PACKAGES) -> list[str]:
    """Packages of `packages` that dpkg does not report as installed."""
    missing = []
    for pkg in packages:
        proc = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", pkg],
            capture_output=True, text=True, timeout=30, check=False,
        )
        if proc.returncode != 0 or not is_installed(proc.stdout):
            missing.append(pkg)
    return missing


def install_packages(packages: Sequence[str]) -> None:
    """apt-get install without recommends, non-interactively."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run_checked(["apt-get", "update", "-qq"], timeout_s=APT_TIMEOUT_S, what="apt-get update",
                env=env)
    run_checked(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
        timeout_s=APT_TIMEOUT_S, what="apt-get install", env=env,
    )


def ensure_users(users: Sequence[str] = TEST_USERS) -> list[str]:
    """Create the users that do not exist yet, with homes; return those created."""
    created = []
    for user in users:
        try:
            pwd.getpwnam(user)
        except KeyError:
            run_checked(["useradd", "-m", "-s", "/bin/bash", user], timeout_s=30,
                        what=f"create user {user}")
            created.append(user)
    return created


def find_plugin_source(explicit: Path | None = None) -> Path | None:
    """The spank_plugin/ directory: explicit, $SLURMRL_SPANK_SRC, the checkout, or cwd."""
    candidates: list[Path] = []
    if explicit is not None:
        candidates.append(explicit)
    if os.environ.get("SLURMRL_SPANK_SRC"):
        candidates.append(Path(os.environ["SLURMRL_SPANK_SRC"]))
    # In a checkout the package sits next to spank_plugin/; an installed copy does not,
    # and then `make` run from the checkout root finds it through the cwd.
    candidates.append(Path(__file__).resolve().parents[2] / "spank_plugin")
    candidates.append(Path.cwd() / "spank_plugin")
    for cand in candidates:
        if (cand / "slurmrl.c").is_file() and (cand / "Makefile").is_file():
            return cand
    if explicit is not None:
        raise DevClusterError(f"{explicit}: no slurmrl.c and Makefile there")
    return None


def build_plugin(src: Path, target: Path) -> None:
    """Build the SPANK plugin with its Makefile (-Wall -Werror) into `target`.

    The Makefile writes a temporary file and renames it, so a slurmstepd that has the old
    .so mapped never sees a half-written library.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    run_checked(["make", "-s", "-C", str(src), f"TARGET={target}"],
                timeout_s=BUILD_TIMEOUT_S, what="build the SPANK plugin")
