"""MUNGE credentials from Python: `ctypes` over libmunge.so.2, no extra dependency.

MUNGE is how Slurm itself learns who is calling: `encode` asks the local munged for a
credential that carries the caller's uid/gid (taken by munged from the socket, so it
cannot be forged) and an optional payload; `decode`, on any node sharing the key, returns
them, and refuses a credential that is expired, replayed (munged keeps a replay cache, so
a credential decodes successfully once), rewound (made in the future) or forged.

Each call makes and destroys its own munge context (libmunge's advice for threads: never
share a context), and frees what libmunge allocates (the credential string from encode,
the payload from decode — also on the errors where munge still returns one).

Known limits: Linux only (libmunge.so.2, `time_t` as C long); needs munged running with
the site key (`MungeCode.SOCKET` otherwise); a payload is bounded by munged's own limit
(`MungeCode.BAD_LENGTH` beyond it). The variadic `munge_ctx_get/set` are called through
ctypes with the fixed arguments typed, which is sound on the SysV x86-64 and aarch64 ABIs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

_SONAME = "libmunge.so.2"

# munge_opt_t values from munge.h
_OPT_TTL = 4
_OPT_ENCODE_TIME = 6
_OPT_SOCKET = 8
_OPT_UID_RESTRICTION = 9


class MungeCode(IntEnum):
    """munge_err_t: libmunge's error numbers (munge.h)."""

    SUCCESS = 0
    SNAFU = 1  #: internal error
    BAD_ARG = 2
    BAD_LENGTH = 3  #: payload over munged's limit
    OVERFLOW = 4
    NO_MEMORY = 5
    SOCKET = 6  #: cannot reach munged (not running, wrong socket path)
    TIMEOUT = 7
    BAD_CRED = 8  #: not a credential at all (garbage, truncated)
    BAD_VERSION = 9
    BAD_CIPHER = 10
    BAD_MAC = 11
    BAD_ZIP = 12
    BAD_REALM = 13
    CRED_INVALID = 14  #: forged or made with another key
    CRED_EXPIRED = 15  #: older than its TTL
    CRED_REWOUND = 16  #: encoded in the future (clock skew)
    CRED_REPLAYED = 17  #: already decoded once
    CRED_UNAUTHORIZED = 18  #: restricted to another uid/gid


class MungeError(Exception):
    """A libmunge failure: `code` (a `MungeCode`), munge's `text`, and for expired,
    rewound and replayed credentials the `uid` munge says made it (for logs only)."""

    def __init__(self, code: int, text: str, uid: int | None = None) -> None:
        self.code: MungeCode | int = (
            MungeCode(code) if code in MungeCode._value2member_map_ else code
        )
        self.text = text
        self.uid = uid
        name = self.code.name if isinstance(self.code, MungeCode) else str(code)
        super().__init__(f"munge error {int(code)} ({name}): {text}")


class MungeUnavailable(MungeError):
    """libmunge.so.2 cannot be loaded (Debian: `apt-get install libmunge2`)."""


@dataclass(frozen=True)
class Decoded:
    """A valid credential's contents, as munged vouches for them."""

    uid: int  #: uid of the process that encoded it
    gid: int  #: its primary gid
    payload: bytes
    encoded_at: int  #: UTC epoch seconds, by the encoding node's munged
    ttl_s: int  #: lifetime it was encoded with


class _Lib:
    """libmunge's functions with their C signatures, and libc's free()."""

    def __init__(self) -> None:
        path = _SONAME
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            found = ctypes.util.find_library("munge")
            if found is None:
                raise MungeUnavailable(
                    MungeCode.SNAFU, f"{_SONAME} not found (install libmunge2)"
                ) from None
            try:
                lib = ctypes.CDLL(found)
            except OSError as exc:
                raise MungeUnavailable(MungeCode.SNAFU, f"cannot load {found}: {exc}") from None
        vp, ip = ctypes.c_void_p, ctypes.c_int
        self.encode = _fn(lib, "munge_encode", ip, [ctypes.POINTER(vp), vp, ctypes.c_char_p, ip])
        self.decode = _fn(
            lib,
            "munge_decode",
            ip,
            [
                ctypes.c_char_p,
                vp,
                ctypes.POINTER(vp),
                ctypes.POINTER(ip),
                ctypes.POINTER(ctypes.c_uint32),
                ctypes.POINTER(ctypes.c_uint32),
            ],
        )
        self.strerror = _fn(lib, "munge_strerror", ctypes.c_char_p, [ip])
        self.ctx_create = _fn(lib, "munge_ctx_create", vp, [])
        self.ctx_destroy = _fn(lib, "munge_ctx_destroy", None, [vp])
        self.ctx_strerror = _fn(lib, "munge_ctx_strerror", ctypes.c_char_p, [vp])
        # variadic: type the fixed (ctx, opt) part; the value is passed as a ctypes object
        self.ctx_set = _fn(lib, "munge_ctx_set", ip, [vp, ip])
        self.ctx_get = _fn(lib, "munge_ctx_get", ip, [vp, ip])
        libc = ctypes.CDLL(None)  # the C library this process already links
        self.free = _fn(libc, "free", None, [vp])


def _fn(lib: ctypes.CDLL, name: str, restype: Any, argtypes: list[Any]) -> Any:
    f = getattr(lib, name)
    f.restype, f.argtypes = restype, argtypes
    return f


@functools.cache
def _lib() -> _Lib:
    return _Lib()


def available() -> bool:
    """Whether libmunge loads (munged may still be down: try `encode` to know)."""
    try:
        _lib()
    except MungeUnavailable:
        return False
    return True


def encode(
    payload: bytes = b"",
    ttl_s: int | None = None,
    socket: str | os.PathLike[str] | None = None,
    *,
    uid_restriction: int | None = None,
) -> str:
    """A credential for the calling process carrying `payload`.

    `ttl_s` None uses munged's default (300 s on Debian). `socket` None uses libmunge's
    default. `uid_restriction` makes the credential decodable only by that uid (so a
    process that intercepts it cannot decode it and burn its single use).
    """
    if not isinstance(payload, bytes | bytearray):
        raise TypeError(f"payload must be bytes, got {type(payload).__name__}")
    if ttl_s is not None and (isinstance(ttl_s, bool) or not 1 <= ttl_s <= 2**31 - 1):
        raise ValueError(f"ttl_s must be a positive number of seconds, got {ttl_s!r}")
    lib = _lib()
    ctx = _context(lib, socket)
    cred = ctypes.c_void_p()
    try:
        if ttl_s is not None:
            _set(lib, ctx, _OPT_TTL, ctypes.c_int(ttl_s))
        if uid_restriction is not None:
            _set(lib, ctx, _OPT_UID_RESTRICTION, ctypes.c_uint32(uid_restriction))
        data = bytes(payload)
        rc = lib.encode(ctypes.byref(cred), ctx, data if data else None, len(data))
        if rc != MungeCode.SUCCESS:
            raise MungeError(rc, _message(lib, ctx, rc))
        raw = ctypes.string_at(cred.value) if cred.value else b""
        return raw.decode("ascii")
    finally:
        if cred.value:
            lib.free(cred)
        lib.ctx_destroy(ctx)


def decode(cred: str, socket: str | os.PathLike[str] | None = None) -> Decoded:
    """The uid, gid and payload of `cred`, or `MungeError` (expired, replayed, invalid...).

    A credential decodes successfully once: a second decode (by anyone, through the same
    munged) fails with `MungeCode.CRED_REPLAYED`.
    """
    if not isinstance(cred, str):
        raise TypeError(f"cred must be str, got {type(cred).__name__}")
    try:
        raw = cred.encode("ascii")
    except UnicodeEncodeError:
        raise MungeError(MungeCode.BAD_CRED, "credential is not ASCII") from None
    if b"\0" in raw:
        raise MungeError(MungeCode.BAD_CRED, "credential contains a NUL byte")
    lib = _lib()
    ctx = _context(lib, socket)
    buf, length = ctypes.c_void_p(), ctypes.c_int()
    uid, gid = ctypes.c_uint32(), ctypes.c_uint32()
    try:
        rc = lib.decode(
            raw, ctx, ctypes.byref(buf), ctypes.byref(length), ctypes.byref(uid),
            ctypes.byref(gid),
        )  # fmt: skip
        # munge allocates the payload also for expired/rewound/replayed credentials
        payload = ctypes.string_at(buf.value, length.value) if buf.value else b""
        if rc != MungeCode.SUCCESS:
            said_uid = (
                uid.value
                if rc in (MungeCode.CRED_EXPIRED, MungeCode.CRED_REWOUND, MungeCode.CRED_REPLAYED)
                else None
            )
            raise MungeError(rc, _message(lib, ctx, rc), said_uid)
        encoded_at, ttl = ctypes.c_long(), ctypes.c_int()
        _get(lib, ctx, _OPT_ENCODE_TIME, ctypes.byref(encoded_at))
        _get(lib, ctx, _OPT_TTL, ctypes.byref(ttl))
        return Decoded(uid.value, gid.value, payload, encoded_at.value, ttl.value)
    finally:
        if buf.value:
            lib.free(buf)
        lib.ctx_destroy(ctx)


def _context(lib: _Lib, socket: str | os.PathLike[str] | None) -> Any:
    ctx = lib.ctx_create()
    if not ctx:
        raise MungeError(MungeCode.NO_MEMORY, "munge_ctx_create failed")
    if socket is not None:
        try:
            _set(lib, ctx, _OPT_SOCKET, ctypes.c_char_p(os.fsencode(socket)))
        except BaseException:
            lib.ctx_destroy(ctx)
            raise
    return ctx


def _set(lib: _Lib, ctx: Any, opt: int, value: Any) -> None:
    rc = lib.ctx_set(ctx, opt, value)
    if rc != MungeCode.SUCCESS:
        raise MungeError(rc, _message(lib, ctx, rc))


def _get(lib: _Lib, ctx: Any, opt: int, pointer: Any) -> None:
    rc = lib.ctx_get(ctx, opt, pointer)
    if rc != MungeCode.SUCCESS:
        raise MungeError(rc, _message(lib, ctx, rc))


def _message(lib: _Lib, ctx: Any, rc: int) -> str:
    """The context's detailed message (names the socket path, say), else munge's text."""
    text = lib.ctx_strerror(ctx) or lib.strerror(rc) or b"unknown munge error"
    return str(text.decode("utf-8", "replace"))
