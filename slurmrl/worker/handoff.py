"""The state file one copy of a service hands to another copy on the same node.

A floating pool runs one job's service as several copies, one per GPU window, in
separate processes on one node; one copy is active at a time. When the job moves to
another window, the active copy writes its whole state to `<handoff dir>/<role>.state`
and frees it (`ServiceBackend.hand_off`), and the copy on the new window loads it
(`ServiceBackend.take_over`). The directory is private to the job's user (mode 0700,
owned by the worker's uid, not a symlink: `prepare_dir` checks it at start) and meant to
be node-local shared memory (`/dev/shm/...`), so the file never leaves the node.

The file is a `torch.save`d dict read back with `weights_only=True` (no code runs on
load); its header (`format`, `generation`) is checked here, its contents by the backend
that reads it. It is written atomically: a temp file in the same directory, then
`os.replace`, so a reader sees the old state or the new one, never half of one. Each
hand-off writes a `generation` one above the writer's own, unless the file already holds
that generation or a later one: then the newer state is kept and nothing is written (a
copy that comes up fresh beside a handed-off state hands off nothing). A copy refuses to
take over a generation older than the one it holds. So stale state never replaces newer
state, in either direction.

Limits: the file stays after a take-over (it is replaced by the next hand-off, and goes
with the directory); in `/dev/shm` it costs host memory the size of the state. One file
per role: two services of one role (rollout replicas) need a directory each. Taking
over reads the whole file into host memory before copying it to the device.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from slurmrl.worker.protocol import BackendError

#: the `format` field of a state file; another value is refused
FORMAT = "slurmrl-handoff/1"


def state_path(handoff_dir: Path, role: str) -> Path:
    """Where a service of `role` hands its state off: `<handoff_dir>/<role>.state`."""
    return handoff_dir / f"{role}.state"


def prepare_dir(path: Path) -> Path:
    """Create `path` (mode 0700) if missing and check that it is private; return it.

    Refused (ValueError naming the path and the problem) unless it is a real directory
    (a symlink is refused, not followed), owned by this process's uid, with no group or
    other permission bits. The parent must exist.
    """
    path = path.absolute()
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass  # an existing one is checked below
    except OSError as exc:
        raise ValueError(f"cannot create handoff dir {path}: {exc.strerror}") from exc
    else:
        os.chmod(path, 0o700)  # the umask may have taken some of the owner's bits
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise ValueError(f"handoff dir {path}: {exc.strerror}") from exc
    if stat.S_ISLNK(st.st_mode):
        raise ValueError(f"handoff dir {path} is a symlink; give the real directory")
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"handoff dir {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise ValueError(f"handoff dir {path} is owned by uid {st.st_uid}, not by this "
                         f"worker's uid {os.geteuid()}")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"handoff dir {path} is accessible to group or others (mode "
                         f"{stat.filemode(st.st_mode)}); chmod 700 it")
    return path


def write_state(path: Path, state: dict[str, Any], generation: int) -> bool:
    """`torch.save` `state` to `path` as `generation`, atomically, unless `path` holds a
    newer one; True when written, False when a newer state was kept.

    "Newer" is a generation of `generation` or above: the writer holds the state of
    `generation - 1` (or older), so such a file was handed off after it — e.g. by a copy
    that took over and went on — and must not be overwritten with older state. A file
    that cannot be read is overwritten. The check and the write hold an exclusive lock
    on the directory (`flock`), so copies handing off at once cannot interleave. The
    write goes to a temp file in the same directory, then `os.replace`: a failure
    (BackendError) leaves `path` as it was and no temp file behind.
    """
    import torch

    try:
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise BackendError(f"cannot write the handoff state to {path}: {exc.strerror}") from exc
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_EX)
        with contextlib.suppress(BackendError):  # unreadable: nothing worth keeping
            kept = peek_generation(path)
            if kept is not None and kept >= generation:
                return False
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                                       dir=path.parent)
        except OSError as exc:
            raise BackendError(f"cannot write the handoff state to {path}: "
                               f"{exc.strerror}") from exc
        try:
            with os.fdopen(fd, "wb") as out:
                torch.save({**state, "format": FORMAT, "generation": generation}, out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if not isinstance(exc, Exception):
                raise
            # a full /dev/shm reaches here as OSError or as torch's RuntimeError
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise BackendError(f"cannot write the handoff state to {path}: {why}") from exc
        return True
    finally:
        os.close(dir_fd)  # and with it the lock


def read_state(path: Path, *, mmap: bool = False) -> dict[str, Any]:
    """Load a state file (weights only); BackendError if missing, corrupt or foreign.

    The dict returned has an integer `generation` >= 0; the rest is the writer's.
    `mmap` maps the tensors instead of reading them (for a look at the header).
    """
    import torch

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise BackendError(f"no handoff state at {path}: no copy of this service has "
                           "handed its state off there") from None
    except Exception as exc:  # torch raises several types for a corrupt file
        raise BackendError(f"handoff state {path} is corrupt or not a state file: "
                           f"{exc}") from exc
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise BackendError(f"handoff state {path} is not a {FORMAT} state file")
    gen = obj.get("generation")
    if isinstance(gen, bool) or not isinstance(gen, int) or gen < 0:
        raise BackendError(f"handoff state {path} has no valid generation: {gen!r}")
    return obj


def peek_generation(path: Path) -> int | None:
    """The generation of the state file at `path`; None when there is no file.

    A file that exists but is not a state file is an error (BackendError): whether it
    holds newer state than a copy's own cannot be told.
    """
    if not os.path.lexists(path):
        return None
    return int(read_state(path, mmap=True)["generation"])
