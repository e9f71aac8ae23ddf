"""`dev-cluster up` runs as root on a state dir it is given: it must not trust what is
already there (an existing dir's owner and mode, symlinks, planted device files), and
every path it writes into the configs is absolute. Real files in a temporary directory,
no Slurm: only the steps that make the dirs and devices, and the rendered configs."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from click.testing import CliRunner

from slurmrl.devcluster import cli
from slurmrl.devcluster.cluster import DevCluster, UpReport
from slurmrl.devcluster.config import ClusterLayout, render_all
from slurmrl.devcluster.host import DevClusterError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="makes device nodes and chowns")

NOBODY = 65534
MEM_DEVICE = os.makedev(1, 1)  # /dev/mem's numbers: what a planted link would reach
NULL_DEVICE = os.makedev(1, 3)  # the fake GPUs' (`up` makes them so)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _up_dirs(state: Path) -> DevCluster:
    cluster = DevCluster(state)
    cluster._make_dirs()
    cluster._make_gpu_devices()
    return cluster


@pytest.fixture
def tight_umask() -> Iterator[None]:
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


# ---- the state dir itself --------------------------------------------------------------
def test_world_writable_state_dir_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)  # `--state-dir /tmp`
    with pytest.raises(DevClusterError, match=f"{shared}.*world-writable"):
        _up_dirs(shared)
    assert _mode(shared) == 0o1777
    assert list(shared.iterdir()) == []


def test_group_writable_state_dir_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o775)
    with pytest.raises(DevClusterError, match="group- or world-writable"):
        _up_dirs(state)
    assert _mode(state) == 0o775


def test_state_dir_of_another_user_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    os.chown(state, NOBODY, NOBODY)
    with pytest.raises(DevClusterError, match=f"{state}.*uid {NOBODY}, not root"):
        _up_dirs(state)
    assert list(state.iterdir()) == []


def test_symlinked_state_dir_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    target.chmod(0o700)
    link = tmp_path / "state"
    link.symlink_to(target)
    with pytest.raises(DevClusterError, match=f"{link}: it is a symlink"):
        _up_dirs(link)
    assert list(target.iterdir()) == []
    assert _mode(target) == 0o700


def test_an_existing_state_dir_keeps_its_mode(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o711)
    _up_dirs(state)
    assert _mode(state) == 0o711
    assert _mode(state / "spool" / "slurmd-localhost") == 0o755


def test_a_new_state_dir_and_its_parents_are_made_traversable(
        tmp_path: Path, tight_umask: None) -> None:
    state = tmp_path / "a" / "b" / "state"
    cluster = _up_dirs(state)
    lay = cluster.layout
    for path in (tmp_path / "a", tmp_path / "a" / "b", state, lay.etc, lay.run, lay.dev,
                 lay.slurmd_spool().parent, *map(lay.slurmd_spool, lay.nodes)):
        assert _mode(path) == 0o755, path
    assert _mode(lay.ctld_state) == 0o700


# ---- what is inside it -----------------------------------------------------------------
def test_a_symlinked_dir_inside_is_refused_and_not_followed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    private = tmp_path / "private"
    private.mkdir()
    private.chmod(0o700)
    (state / "etc").symlink_to(private)
    with pytest.raises(DevClusterError, match=f"{state / 'etc'}.*symlink"):
        _up_dirs(state)
    assert _mode(private) == 0o700


def test_a_dir_inside_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "log").mkdir(parents=True)
    state.chmod(0o755)
    (state / "log").chmod(0o700)
    os.chown(state / "log", NOBODY, NOBODY)
    with pytest.raises(DevClusterError, match=f"{state / 'log'}.*uid {NOBODY}"):
        _up_dirs(state)
    assert _mode(state / "log") == 0o700


@pytest.mark.parametrize("planted", ["symlink", "other-device", "file"])
def test_a_planted_gpu_device_is_replaced_not_chmodded(tmp_path: Path, planted: str) -> None:
    state = tmp_path / "state"
    (state / "dev").mkdir(parents=True)
    state.chmod(0o755)
    mem = tmp_path / "mem"
    os.mknod(mem, 0o600 | stat.S_IFCHR, MEM_DEVICE)
    dev = state / "dev" / "nvidia0"
    if planted == "symlink":
        dev.symlink_to(mem)
    elif planted == "other-device":
        os.mknod(dev, 0o600 | stat.S_IFCHR, MEM_DEVICE)
    else:
        dev.write_text("x")
    _up_dirs(state)
    st = os.lstat(dev)
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == NULL_DEVICE
    assert stat.S_IMODE(st.st_mode) == 0o666
    assert _mode(mem) == 0o600  # what the symlink pointed to is untouched


def test_our_gpu_device_is_kept_and_made_usable(tmp_path: Path, tight_umask: None) -> None:
    state = tmp_path / "state"
    (state / "dev").mkdir(parents=True)
    state.chmod(0o755)
    dev = state / "dev" / "nvidia0"
    os.mknod(dev, 0o600 | stat.S_IFCHR, NULL_DEVICE)
    inode = os.lstat(dev).st_ino
    cluster = _up_dirs(state)
    assert os.lstat(dev).st_ino == inode
    for i in range(cluster.layout.total_gpus):
        assert _mode(cluster.layout.gpu_device(i)) == 0o666


# ---- relative state dirs ---------------------------------------------------------------
PATH_KEYS = ("File", "Loc", "Location", "Dir", "Config")  # slurm.conf/gres.conf keys


def _config_paths(text: str) -> list[str]:
    """Every path in a config file: the values of path keys (SlurmdPidFile=, File=, ...)
    and a plugstack line's plugin."""
    paths = []
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] in ("required", "optional"):
            paths.append(words[1])
        for word in words:
            key, eq, value = word.partition("=")
            if eq and key.endswith(PATH_KEYS):
                paths.append(value)
    return paths


@pytest.mark.parametrize("how", ["state_dir", "layout"])
def test_a_relative_state_dir_gives_absolute_config_paths(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    monkeypatch.chdir(tmp_path)
    cluster = (DevCluster("devstate") if how == "state_dir"
               else DevCluster(layout=ClusterLayout(Path("devstate"))))
    assert cluster.layout.state_dir == tmp_path / "devstate"
    rendered = render_all(cluster.layout)
    assert all(path.is_absolute() for path in rendered)
    paths = [p for text in rendered.values() for p in _config_paths(text)]
    # 8 in slurm.conf, a File= per node in gres.conf, the plugin in plugstack.conf
    assert len(paths) == 8 + len(cluster.layout.nodes) + 1, paths
    assert [p for p in paths if not p.startswith(f"{tmp_path}/devstate/")] == []
    assert cluster.env()["SLURM_CONF"] == f"{tmp_path}/devstate/etc/slurm.conf"


class _FakeCluster:
    made: ClassVar[list[tuple[Path, bool]]] = []

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir

    def up(self, *, cancel_jobs: bool = False) -> UpReport:
        self.made.append((self.state_dir, cancel_jobs))
        return UpReport(cancelled=("41", "42") if cancel_jobs else ())


@pytest.mark.parametrize("via", ["option", "env"])
def test_cli_passes_an_absolute_unresolved_state_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, via: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.setattr(cli, "DevCluster", _FakeCluster)
    _FakeCluster.made = []
    args, env = ["up"], {}
    if via == "option":
        args += ["--state-dir", "link/st"]
    else:
        env["SLURMRL_DEV_STATE"] = "link/st"
    result = CliRunner().invoke(cli.dev_cluster, args, env=env)
    assert result.exit_code == 0, result.output
    # absolute, and not resolved: `up` must see a symlinked state dir to refuse it
    assert _FakeCluster.made == [(tmp_path / "link" / "st", False)]
    assert f"export SLURM_CONF={tmp_path}/link/st/etc/slurm.conf" in result.output


# ---- jobs left by a crashed run --------------------------------------------------------
def test_cli_up_cancel_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "DevCluster", _FakeCluster)
    _FakeCluster.made = []
    result = CliRunner().invoke(cli.dev_cluster, ["up", "--cancel-jobs",
                                                  "--state-dir", "/x/st"])
    assert result.exit_code == 0, result.output
    assert _FakeCluster.made == [(Path("/x/st"), True)]
    assert "cancelled jobs left in the queue: 41 42" in result.output


@pytest.mark.parametrize("cancel_jobs", [False, True])
def test_up_cancels_the_queue_only_when_asked_once_ready(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cancel_jobs: bool) -> None:
    from slurmrl.devcluster import cluster as mod

    calls: list[str] = []
    monkeypatch.setattr(mod.host, "check_host", lambda: None)
    monkeypatch.setattr(mod.host, "missing_packages", lambda: [])
    monkeypatch.setattr(mod.host, "ensure_users", lambda: [])
    c = DevCluster(tmp_path / "st")
    monkeypatch.setattr(c, "_make_dirs", lambda: None)
    monkeypatch.setattr(c, "_make_gpu_devices", lambda: None)
    monkeypatch.setattr(c, "_write_configs", lambda: [])
    monkeypatch.setattr(c, "_build_plugin", lambda: False)
    monkeypatch.setattr(c, "_ensure_munged", lambda: False)
    monkeypatch.setattr(c, "_ensure_slurm_daemon", lambda name: False)
    monkeypatch.setattr(c, "_ensure_slurmd", lambda node: False)
    monkeypatch.setattr(c, "_wait_ready", lambda: calls.append("ready"))
    monkeypatch.setattr(c, "status", lambda: None)

    def query(argv: list[str], timeout_s: float = 0) -> str:
        calls.append(argv[0])
        return "7\n9\n" if argv == ["squeue", "-h", "-o", "%A"] else ""

    monkeypatch.setattr(c, "_query", query)
    report = c.up(cancel_jobs=cancel_jobs)
    if cancel_jobs:
        assert report.cancelled == ("7", "9")
        assert calls[:3] == ["ready", "squeue", "scancel"]
    else:
        assert report.cancelled == ()
        assert calls == ["ready"]
