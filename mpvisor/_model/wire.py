"""What crosses the pipe between the parent and an attempt process, and how is it framed?

A sans-IO codec: it turns messages into bytes and bytes into messages, and never touches a file
descriptor. A frame is a 4-byte big-endian length followed by that many bytes of msgpack. The
decoder refuses a declared length over its limit before buffering it, and reports every
malformed input (oversized, truncated at end of stream, undecodable, ext types, non-str/bytes
map keys, a message that breaks the schema) as one error type, `ProtocolError`.

The schema (protocol version `VERSION`, sent in the child's first message):

| direction | message | fields |
|---|---|---|
| child -> parent | `Hello` | `v` (protocol version), `pid` |
| parent -> child | `Start` | task, id, attempt, kind (`fn`/`cmd`), target or argv, call (the msgpack bytes of `[args, kwargs]`), env, cwd, path (each None when unchanged since the launcher started), max_frame, main_path, limits, sys_argv (a Python target's: the parent's `sys.argv`) |
| child -> parent | `Calling` | (the target is about to be called, or the program exec'd: the timeout clock starts) |
| child -> parent | `Progress` | done, total, message |
| child -> parent | `Ready` | status (the attempt serves: `mpvisor.context().ready(status)`; any number, after `Calling`) |
| child -> parent | `Result` | value |
| child -> parent | `Failure` | kind (`fail`/`fatal`/`canceled`/`error`), reason, exit_code, traceback |

A stop request is not a message: the parent asks with SIGTERM (see `_attempt/context.py`).

A task's arguments are encoded once, when the task is defined (`pack_call`), and every attempt's
`Start` carries those bytes as they are (`call`): `encode_start` frames it in two pieces, so an
attempt never walks, nor copies, a 100 MB argument again, and `start_size` knows the frame's size
at once. The child decodes `call` with `unpack` just before it calls the target.
The start message is the one frame that carries what came from the OS (a program's argv, the
environment, the working directory, `sys.path`): a byte there that is not UTF-8 travels as itself
(`encode_start`, `unpack_start`); every frame a child sends is decoded strictly.
"""

from __future__ import annotations

import struct

import msgpack

from mpvisor._model.tuples import NamedTuple

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a fork server does not)
if TYPE_CHECKING:
    from typing import Any

VERSION = 1
HEADER = struct.Struct(">I")
MAX_FRAME = 2**32 - 1  # the most a frame's length (HEADER) can say: the bound on max_frame_bytes
# What a message over `max_frame_bytes` should become instead (the library's setting: the CLI has none)
OVERSIZE_HINT = "pass large data by path (a file the task reads or writes), or raise SupervisorConfig(max_frame_bytes=...)"


class ProtocolError(Exception):
    """Malformed input on the attempt channel (oversized, truncated, undecodable, off-schema)."""


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack ext type {code} is not allowed")


def pack(obj: Any, *, os_text: bool = False) -> bytes:
    """Encode one msgpack value (ext types and non-msgpack values raise `TypeError`). With
    `os_text`, a str may hold what the OS gave Python (a path, an argument): a byte that is not
    UTF-8 held as a lone surrogate (`surrogateescape`) travels as that byte; `unpack(...,
    os_text=True)` gives back the same text."""
    if os_text:
        return msgpack.packb(obj, use_bin_type=True, unicode_errors="surrogateescape")  # type: ignore[no-any-return]
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def unpack(data: bytes | bytearray | memoryview, *, os_text: bool = False) -> Any:
    """Decode one msgpack value strictly, or raise `ProtocolError`; with `os_text`, a byte that
    is not UTF-8 in a str comes back as the lone surrogate `pack(..., os_text=True)` sent it as."""
    try:
        if os_text:
            return msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=_refuse_ext,
                                   unicode_errors="surrogateescape")
        return msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=_refuse_ext)
    except Exception as exc:  # untrusted bytes: any decoder complaint is a protocol error
        raise ProtocolError(f"undecodable frame: {type(exc).__name__}: {exc}") from None


def frame(payload: bytes) -> bytes:
    """Prefix `payload` with its length."""
    return HEADER.pack(len(payload)) + payload


def encode(message: Message) -> bytes:
    """One message as one frame."""
    return frame(pack(message.to_wire()))


class FrameDecoder:
    """Feed bytes in any chunking; get whole decoded values out.

    `feed` returns the values completed by the new bytes; `finish` checks that the stream did not
    stop inside a frame. It holds at most one frame (`max_frame`) plus one chunk of bytes, and
    decodes a frame where it lies, without a copy."""

    def __init__(self, max_frame: int, *, os_text: bool = False) -> None:
        self.max_frame = max_frame
        self.os_text = os_text  # `unpack`'s: frames whose texts may hold what the OS gave (paths)
        self._buf = bytearray()
        self._need: int | None = None  # body length of the frame being read, once its header is in

    def __repr__(self) -> str:
        return f"<FrameDecoder buffered={len(self._buf)} need={self._need} max={self.max_frame}>"

    def feed(self, data: bytes) -> list[Any]:
        self._buf += data
        out: list[Any] = []
        while True:
            if self._need is None:
                if len(self._buf) < HEADER.size:
                    return out
                (self._need,) = HEADER.unpack_from(self._buf)
                del self._buf[: HEADER.size]
                if self._need > self.max_frame:
                    raise ProtocolError(
                        f"frame of {self._need} bytes exceeds max_frame_bytes={self.max_frame}"
                    )
            if len(self._buf) < self._need:
                return out
            view = memoryview(self._buf)
            try:  # decoded in place: the frame is never copied (what is held: one frame and the value)
                value = unpack(view[: self._need], os_text=self.os_text)
            finally:
                view.release()
            del self._buf[: self._need]
            self._need = None
            out.append(value)

    def finish(self) -> None:
        if self._need is not None:
            raise ProtocolError(
                f"truncated frame: stream ended after {len(self._buf)} of {self._need} bytes"
            )
        if self._buf:
            raise ProtocolError(f"truncated frame: stream ended inside a {HEADER.size}-byte header")


# --- messages (NamedTuples: the launcher imports this module, and dataclasses would pull in
# inspect & co. into every forked attempt) ----------------------------------------------------


class Hello(NamedTuple):
    pid: int
    v: int = VERSION

    def to_wire(self) -> dict[str, Any]:
        return {"t": "hello", "v": self.v, "pid": self.pid}


class Calling(NamedTuple):
    def to_wire(self) -> dict[str, Any]:
        return {"t": "calling"}


class Progress(NamedTuple):
    done: float
    total: float | None = None
    message: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"t": "progress", "done": self.done, "total": self.total, "message": self.message}


class Ready(NamedTuple):
    status: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"t": "ready", "status": self.status}


class Result(NamedTuple):
    value: Any

    def to_wire(self) -> dict[str, Any]:
        return {"t": "result", "value": self.value}


FAILURE_KINDS = ("fail", "fatal", "canceled", "error")


class Failure(NamedTuple):
    kind: str
    reason: str
    exit_code: int | None = None
    traceback: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {
            "t": "failure",
            "kind": self.kind,
            "reason": self.reason,
            "exit_code": self.exit_code,
            "traceback": self.traceback,
        }


class Start(NamedTuple):
    task: str
    id: int
    attempt: int
    kind: str  # "fn" or "cmd"
    target: str
    call: bytes  # `pack_call(args, kwargs)`, encoded once when the task was defined
    argv: list[str]
    env: dict[str, str] | None  # None: as the launcher started (likewise cwd and path)
    cwd: str | None
    path: list[str] | None
    max_frame: int
    main_path: str | None = None
    limits: dict[str, Any] | None = None  # {"memory", "cpu", "nofile", "as"}: the launcher keeps memory, the child sets the rest
    sys_argv: list[str] | None = None  # a Python target's: the parent's `sys.argv` (as multiprocessing's spawn gives it)
    stop_signal: int = 15  # a program's: what it is asked to stop with, at its default action from its exec (SIGTERM: 15)
    v: int = VERSION

    def to_wire(self) -> dict[str, Any]:
        return {"t": "start", **self._asdict()}


Message = Hello | Calling | Progress | Ready | Result | Failure | Start

_SCHEMA: dict[str, tuple[type, dict[str, tuple[type, ...]]]] = {
    "hello": (Hello, {"v": (int,), "pid": (int,)}),
    "calling": (Calling, {}),
    "progress": (
        Progress,
        {"done": (int, float), "total": (int, float, type(None)), "message": (str, type(None))},
    ),
    "ready": (Ready, {"status": (str, type(None))}),
    "result": (Result, {"value": (object,)}),
    "failure": (
        Failure,
        {
            "kind": (str,),
            "reason": (str,),
            "exit_code": (int, type(None)),
            "traceback": (str, type(None)),
        },
    ),
}


_KEYS = {t: frozenset({"t", *fields}) for t, (_, fields) in _SCHEMA.items()}  # each message's keys, "t" too


def parse(obj: Any, allowed: tuple[str, ...] = tuple(_SCHEMA)) -> Message:
    """Check a decoded value against the schema of the messages in `allowed`."""
    if not isinstance(obj, dict) or obj.get("t") not in allowed:
        raise ProtocolError(f"unexpected message: {_short(obj)}")
    cls, fields = _SCHEMA[obj["t"]]
    if obj.keys() != _KEYS[obj["t"]]:
        raise ProtocolError(f"malformed {obj['t']!r} message: fields {sorted(map(str, obj))}")
    for name, types in fields.items():
        value = obj[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types and types != (object,)):
            raise ProtocolError(f"malformed {obj['t']!r} message: {name}={_short(value)}")
    if cls is Failure and obj["kind"] not in FAILURE_KINDS:
        raise ProtocolError(f"malformed 'failure' message: kind={obj['kind']!r}")
    return cls(**{k: v for k, v in obj.items() if k != "t"})  # type: ignore[no-any-return]


def pack_call(args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> bytes:
    """The msgpack bytes of a call's `[args, kwargs]` (what `Start.call` carries)."""
    return pack([list(args), kwargs])


def encode_start(start: Start) -> tuple[bytes, bytes]:
    """The start frame in two pieces, to be sent one after the other: everything up to the
    `call` bytes (length prefix, the other fields, `call`'s bin header), and `call` itself, never
    copied. Decodes (`unpack_start`) to the same message as `encode(start)`: the other fields
    are packed as one map, whose header then counts `call` too. A program's argv, the
    environment, the working directory and `sys.path` come from the OS, where Python holds a byte
    that is not UTF-8 as a lone surrogate (`surrogateescape`): such a byte travels as itself, and
    `unpack_start` gives back the same text."""
    fields = start.to_wire()
    call = fields.pop("call")
    packed = pack(fields, os_text=True)
    head = b"".join((_map_header(len(fields) + 1), memoryview(packed)[len(_map_header(len(fields))):],
                     _CALL_KEY, _bin_header(len(call))))
    return HEADER.pack(len(head) + len(call)) + head, call


_CALL_KEY = msgpack.packb("call")


def _map_header(n: int) -> bytes:
    """msgpack's header of a map of `n` entries (fixmap, map 16 or map 32)."""
    if n < 16:
        return bytes((0x80 | n,))
    if n < 2**16:
        return struct.pack(">BH", 0xDE, n)
    return struct.pack(">BI", 0xDF, n)


def _bin_header(n: int) -> bytes:
    """msgpack's header of a bin value of `n` bytes (bin 8, bin 16 or bin 32)."""
    if n < 2**8:
        return struct.pack(">BB", 0xC4, n)
    if n < 2**16:
        return struct.pack(">BH", 0xC5, n)
    return struct.pack(">BI", 0xC6, n)


def start_size(start: Start) -> int:
    """The number of bytes of the start frame's body (what `max_frame_bytes` limits)."""
    head, call = encode_start(start)
    return len(head) - HEADER.size + len(call)


def unpack_start(data: bytes | bytearray | memoryview) -> Start:
    """The child's decoding of the start frame's body (`encode_start`): a byte that is not UTF-8
    comes back as the lone surrogate it was sent as. (What the parent decodes from a child stays
    strict: `unpack`.)"""
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=_refuse_ext,
                              unicode_errors="surrogateescape")
    except Exception as exc:
        raise ProtocolError(f"undecodable start frame: {type(exc).__name__}: {exc}") from None
    return parse_start(obj)


def parse_start(obj: Any) -> Start:
    """The child's check of the parent's start message (trusted, but versioned)."""
    if not isinstance(obj, dict) or obj.get("t") != "start" or obj.get("v") != VERSION:
        raise ProtocolError(f"unexpected start message: {_short(obj)}")
    return Start(**{k: v for k, v in obj.items() if k != "t"})


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
