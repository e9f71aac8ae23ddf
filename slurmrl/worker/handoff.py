"""The state file one copy of a service hands to another copy on the same node.

A floating pool runs one job's service as several copies, one per GPU window, in
separate processes on one node; one copy is active at a time. When the job moves to
another window, the active copy writes its whole state to `<handoff dir>/<role>.state`
and frees it (`ServiceBackend.hand_off`), and the copy on the new window loads it
(`ServiceBackend.take_over`). The directory is private to the job's user (mode 0700,
owned by the worker's uid, not a symlink: `prepare_dir` checks it at start) and meant to
be node-local shared memory (`/dev/shm/...`), so the file never leaves the node.

The file holds a tree of dicts, lists, tuples, scalars and tensors (the backend's
state) in a raw layout, with no pickle anywhere, so reading it runs no code:

    b"slurmrl-handoff\\n"   16 bytes of magic
    <u64 little-endian>     the header's length in bytes
    header                  JSON, UTF-8 (below)
    zero padding            to a multiple of 64 bytes: the data section starts here
    data                    each tensor's raw bytes (C order, this host's byte order),
                            at its offset from the data section's start (a multiple of 64)

The header is `{"format": "slurmrl-handoff/2", "generation": int, "byteorder": "little",
"data_bytes": int, "tensors": [...], "state": tree}`. Each entry of `tensors` is
`{"key": [path in the tree], "dtype": "float32", "shape": [...], "offset": int,
"nbytes": int}`. In `state`, a tensor is `{"$tensor": index into tensors}`, a tuple
`{"$tuple": [...]}`, a dict whose keys are not all strings (an optimizer's parameter
indices), or has a key starting with `$`, `{"$dict": [[key, value], ...]}`; any other
dict is a JSON object, and lists, strings, numbers (floats exactly, NaN and infinities
included), booleans and null are themselves. The file must be exactly as long as the
header says (`data_bytes` after the padded header), every tensor inside it, its bytes
the size its dtype and shape make, each entry used once, at the path its `key` names:
anything else is refused as corrupt or truncated (BackendError), as is an unknown
`format` (another version's file: the old `torch.save` format included).

`read_state` maps the file (copy-on-write) and gives its tensors as CPU views of that
mapping, nothing copied: the reader copies each into its own tensors (the model's
`load_state_dict`, device copies included). It is written atomically: a temp file in
the same directory, then `os.replace`, so a reader sees the old state or the new one,
never half of one. A hand-off of a state that changed since the writer's generation
(trained, weights imported) writes a `generation` one above the writer's own; one that
did not (a copy fresh from loading, or one that took a state over and did nothing)
writes the writer's own generation. Either way nothing is written when the file already
holds that generation or a later one: the newer state is kept (a copy that comes up
fresh beside a handed-off state hands off nothing). A fresh copy's state is generation
0, so the job's first trained hand-off on one node always reads newer than a fresh
copy's on another. A copy refuses to take over a generation older than the one it
holds. So stale state never replaces newer state, in either direction.

Limits: the file stays after a take-over (it is replaced by the next hand-off, and goes
with the directory); in `/dev/shm` it costs host memory the size of the state. One file
per role: two services of one role (rollout replicas) need a directory each. The
tensors' bytes carry no checksum (nor did the `torch.save` format's, as read here): a
flipped byte inside a tensor loads as a different value; the size and layout checks
catch truncation and a damaged header. A file truncated *in place* while a reader copies
from its mapping would kill the reader (SIGBUS); writers here never change a published
file, they replace it. Tensors are written from CPU copies, one tensor at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import mmap
import os
import stat
import struct
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeGuard

from slurmrl.worker.protocol import BackendError

if TYPE_CHECKING:
    import torch

#: the `format` field of a state file; another value is refused
FORMAT = "slurmrl-handoff/2"
#: the first bytes of a state file
MAGIC = b"slurmrl-handoff\n"
#: magic, then the header's length
_PREFIX = struct.Struct(f"<{len(MAGIC)}sQ")
#: alignment of the data section and of each tensor in it
ALIGN = 64
#: dtypes a state file holds, by the name the header gives them
_DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
                "complex64", "complex128", "int64", "int32", "int16", "int8", "uint64",
                "uint32", "uint16", "uint8", "bool")
_TENSOR_FIELDS = {"key", "dtype", "shape", "offset", "nbytes"}
_Path = list[str | int]  # where a value sits in the state tree


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
    """Write `state` to `path` as `generation`, atomically, unless `path` holds a newer
    one; True when written, False when a newer state was kept.

    "Newer" is a generation of `generation` or above: the writer holds the state of
    `generation - 1` (or older), so such a file was handed off after it — e.g. by a copy
    that took over and went on — and must not be overwritten with older state. A file
    that cannot be read is overwritten. The check and the write hold an exclusive lock
    on the directory (`flock`), so copies handing off at once cannot interleave. The
    write goes to a temp file (mode 0600) in the same directory, then `os.replace`: a
    failure (BackendError; also a value the format cannot hold) leaves `path` as it was
    and no temp file behind.
    """
    return _publish(path, lambda out: _write(out, state, generation), generation,
                    f"cannot write the handoff state to {path}")


def store_stream(path: Path, fill: Callable[[BinaryIO], object],
                 failed: str | None = None, expected: int | None = None,
                 must_hold: Mapping[str, str] | None = None) -> bool:
    """Store a state file another copy handed off on another node, written by `fill`
    into a temp file as it arrives (`ServiceHandle.handoff_state_into`: never whole in
    memory), at `path`, unless `path` holds that generation or a newer one; True when
    stored. The file is checked as a state file first (whole: header, size and every
    tensor's place, as `read_state` checks a file; BackendError naming what is wrong,
    or starting with `failed` where `fill` fails, and `path` is left as it was); then
    published as `write_state` publishes: under the directory's lock, from a temp file,
    `os.replace`d into place. `expected`: the generation the source says it holds;
    where `path` holds it or a newer one once the lock is taken (another fetch of it
    just landed), nothing is fetched. `must_hold`: fields the state must have as they
    are (the storing service's `backend` and `role`): another service's state is
    refused (BackendError) and `path` left as it was."""
    return _publish(path, fill, None, failed or f"cannot store the handoff state at {path}",
                    expected, must_hold)


def discard(directory: Path, role: str) -> bool:
    """Remove `role`'s state file from a hand-off directory, with any temp file of it a
    writer killed mid-write left, then the directory once nothing else is in it; True
    when a state file was there. Under the directory's lock: a store under way (a
    fetch) finishes first, so nothing lands after the discard."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_EX)
        path = state_path(directory, role)
        had = path.exists()
        path.unlink(missing_ok=True)
        for tmp in directory.glob(f".{path.name}.*.tmp"):  # no writer holds the lock
            tmp.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # another role's file is still there
            directory.rmdir()
        return had
    finally:
        os.close(dir_fd)


def _publish(path: Path, fill: Callable[[BinaryIO], object], generation: int | None,
             failed: str, expected: int | None = None,
             must_hold: Mapping[str, str] | None = None) -> bool:
    """Under an exclusive lock on `path`'s directory, unless `path` holds `generation`
    (else `expected`) or a newer one: `fill` a temp file (mode 0600) there and
    `os.replace` it onto `path`; True when replaced. `generation` None: the temp file's
    own, read back and checked whole first (and its `must_hold` fields). A failure is
    a BackendError starting with `failed` (or naming what is wrong with the temp file's
    state), and leaves no temp file behind."""

    def kept_newer(gen: int) -> bool:
        with contextlib.suppress(BackendError):  # unreadable: nothing worth keeping
            kept = peek_generation(path)
            return kept is not None and kept >= gen
        return False

    try:
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise BackendError(f"{failed}: {exc.strerror}") from exc
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_EX)
        known = generation if generation is not None else expected
        if known is not None and kept_newer(known):
            return False
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                                       dir=path.parent)
        except OSError as exc:
            raise BackendError(f"{failed}: {exc.strerror}") from exc
        try:
            with os.fdopen(fd, "wb") as out:
                fill(out)
                out.flush()
                os.fsync(out.fileno())
            # a fetched file (no generation given) is checked whole before it counts
            if generation is None and kept_newer(
                    _fetched_generation(Path(tmp), must_hold or {}, failed)):
                os.unlink(tmp)
                return False
            os.replace(tmp, path)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(exc, BackendError):
                raise BackendError(str(exc).replace(tmp, f"the state for {path}")) from None
            if not isinstance(exc, Exception):
                raise
            # a full /dev/shm reaches here as OSError, a device copy's failure as torch's
            # RuntimeError, a value the format cannot hold as TypeError
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise BackendError(f"{failed}: {why}") from exc
        return True
    finally:
        os.close(dir_fd)  # and with it the lock


def _fetched_generation(path: Path, must_hold: Mapping[str, str], failed: str) -> int:
    """The generation of a fetched state file, read whole (`read_state`), whose
    `must_hold` fields have those values; else BackendError starting with `failed`."""
    state = read_state(path)
    wrong = {k: state.get(k) for k, v in must_hold.items() if state.get(k) != v}
    generation = int(state["generation"])
    del state  # its tensors map the file
    if wrong:
        raise BackendError(f"{failed}: it holds the state of another service ({wrong}); "
                           f"this one is {dict(must_hold)}")
    return generation


def read_state(path: Path) -> dict[str, Any]:
    """The state in a state file; BackendError if missing, corrupt, truncated or foreign.

    The dict returned is the writer's state with `format` and an integer `generation`
    >= 0 added; its tensors are CPU views of a copy-on-write mapping of the file (kept
    open while any of them lives), to be copied from, not kept.
    """
    import torch

    with _open(path) as fd:
        header, data_start, size = _read_header(fd, path)
        table = header.get("tensors")
        if not isinstance(table, list):
            raise BackendError(f"handoff state {path} is corrupt: its header has no "
                               "tensor table")
        entries = [_check_entry(e, i, header["data_bytes"], path) for i, e in enumerate(table)]
        views: list[torch.Tensor] = []
        if entries:
            try:
                mapping = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
            except (OSError, ValueError) as exc:
                raise BackendError(f"handoff state {path} cannot be mapped: {exc}") from exc
            if len(mapping) != size:
                raise BackendError(f"handoff state {path} changed size while being read")
            data = torch.frombuffer(mapping, dtype=torch.uint8)
            for key, dtype, shape, offset, nbytes in entries:
                begin = data_start + offset
                try:
                    views.append(data[begin : begin + nbytes].view(dtype).view(shape))
                except RuntimeError as exc:
                    raise BackendError(f"handoff state {path} is corrupt: tensor "
                                       f"{_name(key)}: {exc}") from exc
    decoder = _Decoder(path, [e[0] for e in entries], views)
    try:
        state = decoder.decode(header.get("state"), [])
    except RecursionError:
        raise BackendError(f"handoff state {path} is corrupt: its state is nested too "
                           "deeply") from None
    unused = [_name(entries[i][0]) for i in range(len(entries)) if i not in decoder.used]
    if not isinstance(state, dict) or unused:
        raise BackendError(f"handoff state {path} is corrupt: "
                           + (f"tensors {unused} are not in its state" if unused
                              else "its state is not a JSON object"))
    return {**state, "format": FORMAT, "generation": header["generation"]}


def peek_generation(path: Path) -> int | None:
    """The generation of the state file at `path`; None when there is no file.

    A file that exists but is not a state file is an error (BackendError): whether it
    holds newer state than a copy's own cannot be told. Reads the header only.
    """
    if not os.path.lexists(path):
        return None
    with _open(path) as fd:
        return int(_read_header(fd, path)[0]["generation"])


# --- writing ---------------------------------------------------------------------------


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class _Encoder:
    """The state tree as JSON, its tensors laid out in the data section in tree order."""

    def __init__(self) -> None:
        self.table: list[dict[str, Any]] = []
        self.tensors: list[torch.Tensor] = []
        self.end = 0  # of the data section so far

    def encode(self, value: Any, path: _Path) -> Any:
        import torch

        if value is None or isinstance(value, bool | int | float | str):
            return value
        if isinstance(value, torch.Tensor):
            return {"$tensor": self._tensor(value, path)}
        if isinstance(value, list):
            return [self.encode(v, [*path, i]) for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return {"$tuple": [self.encode(v, [*path, i]) for i, v in enumerate(value)]}
        if isinstance(value, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in value):
                return {k: self.encode(v, [*path, k]) for k, v in value.items()}
            bad = [k for k in value if isinstance(k, bool) or not isinstance(k, str | int)]
            if bad:
                raise TypeError(f"{_name(path)} has a key {bad[0]!r} that a state file "
                                "cannot hold (only strings and integers)")
            return {"$dict": [[k, self.encode(v, [*path, k])] for k, v in value.items()]}
        raise TypeError(f"{_name(path)} is a {type(value).__name__}, which a state file "
                        "cannot hold")

    def _tensor(self, value: torch.Tensor, path: _Path) -> int:
        import torch

        name = str(value.dtype).removeprefix("torch.")
        if (value.layout is not torch.strided or value.is_quantized or value.is_meta
                or name not in _DTYPE_NAMES):
            raise TypeError(f"{_name(path)} is a {value.layout} {value.dtype} tensor on "
                            f"{value.device}; a state file holds dense tensors of "
                            f"{', '.join(_DTYPE_NAMES)}")
        offset = _align(self.end)
        nbytes = value.numel() * value.element_size()
        self.table.append({"key": path, "dtype": name, "shape": list(value.shape),
                           "offset": offset, "nbytes": nbytes})
        self.tensors.append(value)
        self.end = offset + nbytes
        return len(self.table) - 1


def _write(out: Any, state: dict[str, Any], generation: int) -> None:
    """The whole file, through the buffered `out` (which writes each buffer in full)."""
    import torch

    enc = _Encoder()
    tree = enc.encode(state, [])
    header = json.dumps({"format": FORMAT, "generation": generation,
                         "byteorder": sys.byteorder, "data_bytes": enc.end,
                         "tensors": enc.table, "state": tree},
                        separators=(",", ":")).encode()
    head = _PREFIX.pack(MAGIC, len(header)) + header
    out.write(head)
    out.write(bytes(_align(len(head)) - len(head)))
    pos = 0
    for entry, value in zip(enc.table, enc.tensors, strict=True):
        out.write(bytes(entry["offset"] - pos))
        if entry["nbytes"]:
            # one tensor at a time on the host (a device tensor's copy is freed after it)
            host = value.detach().to("cpu").contiguous().resolve_conj().resolve_neg()
            out.write(host.reshape(-1).view(torch.uint8).numpy())
        pos = entry["offset"] + entry["nbytes"]


# --- reading ---------------------------------------------------------------------------


@contextlib.contextmanager
def _open(path: Path) -> Iterator[int]:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise BackendError(f"no handoff state at {path}: no copy of this service has "
                           "handed its state off there") from None
    except OSError as exc:
        raise BackendError(f"handoff state {path} cannot be read: {exc.strerror}") from exc
    try:
        yield fd
    finally:
        os.close(fd)


def _read_header(fd: int, path: Path) -> tuple[dict[str, Any], int, int]:
    """The checked header, where the data section starts, and the file's size."""
    bad = f"handoff state {path}"
    try:
        size = os.fstat(fd).st_size
        prefix = os.pread(fd, _PREFIX.size, 0)
    except OSError as exc:
        raise BackendError(f"{bad} cannot be read: {exc.strerror}") from exc
    if len(prefix) < _PREFIX.size or not prefix.startswith(MAGIC):
        raise BackendError(f"{bad} is not a {FORMAT} state file (it does not start with "
                           f"{MAGIC!r})")
    length = _PREFIX.unpack(prefix)[1]
    if length > size - _PREFIX.size:
        raise BackendError(f"{bad} is corrupt: truncated in its header ({size} bytes, "
                           f"the header alone needs {_PREFIX.size + length})")
    try:
        raw = os.pread(fd, length, _PREFIX.size)
    except OSError as exc:
        raise BackendError(f"{bad} cannot be read: {exc.strerror}") from exc
    try:
        if len(raw) != length:
            raise ValueError(f"{len(raw)} of {length} bytes read")
        header = json.loads(raw, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as exc:  # a UnicodeDecodeError is a ValueError
        raise BackendError(f"{bad} is corrupt: its header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise BackendError(f"{bad} is corrupt: its header is not a JSON object")
    if header.get("format") != FORMAT:
        raise BackendError(f"{bad} is {header.get('format')!r}, not a {FORMAT} state file "
                           "(written by another version of slurmrl?)")
    gen = header.get("generation")
    if not _is_count(gen):
        raise BackendError(f"{bad} has no valid generation: {gen!r}")
    if header.get("byteorder") != sys.byteorder:
        raise BackendError(f"{bad} was written {header.get('byteorder')}-endian; this "
                           f"host is {sys.byteorder}-endian")
    data_bytes = header.get("data_bytes")
    data_start = _align(_PREFIX.size + length)
    if not _is_count(data_bytes) or size != data_start + data_bytes:
        raise BackendError(f"{bad} is corrupt or truncated: {size} bytes, its header "
                           f"accounts for {data_start} + data_bytes {data_bytes!r}")
    return header, data_start, size


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("a key is repeated in an object")
    return out


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_key(value: Any) -> bool:
    """A dict key or list index in the state tree: a string or an integer."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _name(path: Sequence[Any]) -> str:
    return "/".join(map(str, path)) or "the state"


def _check_entry(entry: Any, index: int, data_bytes: int,
                 path: Path) -> tuple[_Path, torch.dtype, list[int], int, int]:
    """One `tensors` entry as (key, dtype, shape, offset, nbytes), or BackendError."""
    import torch

    bad = f"handoff state {path} is corrupt: tensor entry {index}"
    if not isinstance(entry, dict) or set(entry) != _TENSOR_FIELDS:
        raise BackendError(f"{bad} is not {{{', '.join(sorted(_TENSOR_FIELDS))}}}")
    key, name, shape = entry["key"], entry["dtype"], entry["shape"]
    offset, nbytes = entry["offset"], entry["nbytes"]
    if (not isinstance(key, list) or not key
            or not all(_is_key(k) for k in key)):
        raise BackendError(f"{bad} has no valid key: {key!r}")
    bad = f"handoff state {path} is corrupt: tensor {_name(key)}"
    if name not in _DTYPE_NAMES:
        raise BackendError(f"{bad} has an unknown dtype {name!r}")
    if not isinstance(shape, list) or not all(_is_count(n) for n in shape):
        raise BackendError(f"{bad} has no valid shape: {shape!r}")
    if not _is_count(offset) or not _is_count(nbytes) or offset % ALIGN:
        raise BackendError(f"{bad} has no valid offset and length: {offset!r}, {nbytes!r}")
    dtype = getattr(torch, name)
    if nbytes != math.prod(shape) * dtype.itemsize:
        raise BackendError(f"{bad} has {nbytes} bytes; {name} of shape {tuple(shape)} "
                           f"takes {math.prod(shape) * dtype.itemsize}")
    if offset + nbytes > data_bytes:
        raise BackendError(f"{bad} runs past the end of the data ({offset} + {nbytes} > "
                           f"{data_bytes} bytes)")
    return key, dtype, shape, offset, nbytes


#: the deepest a state file's state may nest (a trainer's is 5 levels: optimizer, state,
#: parameter, moment, tensor)
MAX_DEPTH = 64


class _Decoder:
    """The state tree from its JSON, each `$tensor` replaced by its view."""

    def __init__(self, path: Path, keys: list[_Path], views: list[torch.Tensor]) -> None:
        self.bad = f"handoff state {path} is corrupt"
        self.keys, self.views = keys, views
        self.used: set[int] = set()

    def decode(self, obj: Any, path: _Path) -> Any:
        if len(path) > MAX_DEPTH:  # not left to Python's recursion limit, which
            # Python 3.12 reaches at twice the depth 3.11 did (inlined comprehensions)
            raise BackendError(f"{self.bad}: its state is nested too deeply (over "
                               f"{MAX_DEPTH} levels)")
        if isinstance(obj, list):
            return [self.decode(v, [*path, i]) for i, v in enumerate(obj)]
        if not isinstance(obj, dict):
            return obj  # JSON's scalars are the state's
        tags = [k for k in obj if k.startswith("$")]
        if not tags:
            return {k: self.decode(v, [*path, k]) for k, v in obj.items()}
        if len(obj) != 1:
            raise BackendError(f"{self.bad}: {_name(path)} mixes {tags[0]} with other keys")
        tag, value = next(iter(obj.items()))
        if tag == "$tensor":
            return self._tensor(value, path)
        if tag == "$tuple" and isinstance(value, list):
            return tuple(self.decode(v, [*path, i]) for i, v in enumerate(value))
        if tag == "$dict" and isinstance(value, list):
            out: dict[Any, Any] = {}
            for item in value:
                if (not isinstance(item, list) or len(item) != 2
                        or not _is_key(item[0])
                        or item[0] in out):
                    raise BackendError(f"{self.bad}: {_name(path)} has a bad $dict item")
                out[item[0]] = self.decode(item[1], [*path, item[0]])
            return out
        raise BackendError(f"{self.bad}: {_name(path)} is an unknown {tag}")

    def _tensor(self, index: Any, path: _Path) -> torch.Tensor:
        if not _is_count(index) or index >= len(self.views):
            raise BackendError(f"{self.bad}: {_name(path)} names no tensor ({index!r})")
        if index in self.used or self.keys[index] != path:
            raise BackendError(f"{self.bad}: {_name(path)} is tensor {index}, whose key is "
                               f"{_name(self.keys[index])}")
        self.used.add(index)
        return self.views[index]
