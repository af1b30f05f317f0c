"""SPDY/3.1 framing: frames as values, their wire form, and the compressed header blocks.

Why it exists: the API server speaks SPDY/3.1 to a kubelet's ``/portForward`` (kube-apiserver
translates kubectl's WebSocket tunnel to it unless the Node declares ``ExtendWebSocketsToKubelet``,
which the virtual node does not). No maintained Python SPDY library exists, so this module
implements the part of the SPDY/3.1 specification a port-forward server needs, from the spec:

* control frames ``SYN_STREAM``, ``SYN_REPLY``, ``RST_STREAM``, ``SETTINGS``, ``PING``,
  ``GOAWAY``, ``HEADERS``, ``WINDOW_UPDATE`` (an unknown control type is skipped, as the spec
  says) and ``DATA`` frames;
* header blocks: a 32-bit pair count, then length-prefixed names and values, compressed with one
  zlib stream per direction and connection against :data:`~.dictionary.DICTIONARY`, each block
  ended with a sync flush (:class:`HeaderCodec`).

Pure: no I/O. :func:`parse_head` and :func:`decode` turn bytes into frames (raising
:class:`FrameError` for anything malformed); :func:`encode` turns frames into bytes. Inflated
header blocks are bounded (:data:`MAX_HEADER_BLOCK`): a peer cannot make the provider inflate a
zlib bomb.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Final

from vkprovider.api.portforward.dictionary import DICTIONARY
from vkprovider.errors import VKError

__all__ = [
    "FLAG_FIN",
    "FLAG_UNIDIRECTIONAL",
    "HEAD_SIZE",
    "INITIAL_WINDOW",
    "MAX_HEADER_BLOCK",
    "VERSION",
    "Data",
    "Frame",
    "FrameError",
    "FrameHead",
    "GoAway",
    "HeaderCodec",
    "Headers",
    "HeadersFrame",
    "Ping",
    "RstStatus",
    "RstStream",
    "Settings",
    "SynReply",
    "SynStream",
    "Unknown",
    "WindowUpdate",
    "decode",
    "encode",
    "parse_head",
]

VERSION: Final = 3
HEAD_SIZE: Final = 8
FLAG_FIN: Final = 0x01
FLAG_UNIDIRECTIONAL: Final = 0x02
#: The stream window both sides start with unless SETTINGS says otherwise (SPDY/3.1 2.6.8).
INITIAL_WINDOW: Final = 65536
#: The largest inflated header block accepted (a port-forward stream carries three headers).
MAX_HEADER_BLOCK: Final = 64 * 1024
SETTINGS_MAX_CONCURRENT_STREAMS: Final = 4
SETTINGS_INITIAL_WINDOW_SIZE: Final = 7

_SYN_STREAM, _SYN_REPLY, _RST_STREAM, _SETTINGS = 1, 2, 3, 4
_PING, _GOAWAY, _HEADERS, _WINDOW_UPDATE = 6, 7, 8, 9
_MASK31: Final = 0x7FFFFFFF


class FrameError(VKError):
    """Bytes that are not a valid SPDY/3.1 frame; the session answers with a GOAWAY or RST."""


class RstStatus(IntEnum):
    """RST_STREAM status codes (SPDY/3.1 2.6.3)."""

    PROTOCOL_ERROR = 1
    INVALID_STREAM = 2
    REFUSED_STREAM = 3
    UNSUPPORTED_VERSION = 4
    CANCEL = 5
    INTERNAL_ERROR = 6
    FLOW_CONTROL_ERROR = 7
    STREAM_IN_USE = 8
    STREAM_ALREADY_CLOSED = 9
    FRAME_TOO_LARGE = 11


Headers = dict[str, str]  # names lowercase, as SPDY requires; NUL-joined multiple values kept


@dataclass(frozen=True, kw_only=True)
class SynStream:
    stream_id: int
    headers: Headers = field(default_factory=dict)
    associated_to: int = 0
    priority: int = 0
    flags: int = 0


@dataclass(frozen=True, kw_only=True)
class SynReply:
    stream_id: int
    headers: Headers = field(default_factory=dict)
    flags: int = 0


@dataclass(frozen=True, kw_only=True)
class HeadersFrame:
    stream_id: int
    headers: Headers = field(default_factory=dict)
    flags: int = 0


@dataclass(frozen=True, kw_only=True)
class RstStream:
    stream_id: int
    status: int


@dataclass(frozen=True, kw_only=True)
class Settings:
    #: (flags, id, value) per entry
    entries: tuple[tuple[int, int, int], ...] = ()
    flags: int = 0

    def value(self, setting: int) -> int | None:
        for _, key, value in self.entries:
            if key == setting:
                return value
        return None


@dataclass(frozen=True, kw_only=True)
class Ping:
    ping_id: int


@dataclass(frozen=True, kw_only=True)
class GoAway:
    last_good_stream_id: int
    status: int = 0


@dataclass(frozen=True, kw_only=True)
class WindowUpdate:
    stream_id: int
    delta: int


@dataclass(frozen=True, kw_only=True)
class Data:
    stream_id: int
    data: bytes = b""
    flags: int = 0

    @property
    def fin(self) -> bool:
        return bool(self.flags & FLAG_FIN)


@dataclass(frozen=True, kw_only=True)
class Unknown:
    """A control frame of a type this module does not know: to be ignored."""

    frame_type: int


Frame = (SynStream | SynReply | HeadersFrame | RstStream | Settings | Ping | GoAway
         | WindowUpdate | Data | Unknown)


@dataclass(frozen=True, kw_only=True)
class FrameHead:
    """The 8 bytes every frame starts with, decoded: what follows is ``length`` bytes."""

    control: bool
    version: int  # control frames only
    frame_type: int  # control frames only
    stream_id: int  # data frames only
    flags: int
    length: int


class HeaderCodec:
    """One direction's header compression state (SPDY keeps one zlib stream per direction).

    The same object must see every header block of its direction, in order: a block inflates
    only against the state the previous blocks left.
    """

    def __init__(self) -> None:
        self._deflate = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, 15, 8,
                                         zlib.Z_DEFAULT_STRATEGY, zdict=DICTIONARY)
        self._inflate = zlib.decompressobj(15, zdict=DICTIONARY)

    def pack(self, headers: Headers) -> bytes:
        """``headers`` as a compressed block (names lowercased)."""
        raw = [struct.pack(">I", len(headers))]
        for name, value in headers.items():
            key = name.lower().encode("utf-8")
            val = value.encode("utf-8")
            raw += [struct.pack(">I", len(key)), key, struct.pack(">I", len(val)), val]
        body = b"".join(raw)
        return self._deflate.compress(body) + self._deflate.flush(zlib.Z_SYNC_FLUSH)

    def unpack(self, block: bytes) -> Headers:
        """A compressed block as headers; :class:`FrameError` when it is not one."""
        try:
            raw = self._inflate.decompress(block, MAX_HEADER_BLOCK + 1)
        except zlib.error as exc:
            raise FrameError(f"header block does not inflate: {exc}") from None
        if len(raw) > MAX_HEADER_BLOCK or self._inflate.unconsumed_tail:
            raise FrameError(f"header block inflates to more than {MAX_HEADER_BLOCK} bytes")
        return _parse_block(raw)


def _parse_block(raw: bytes) -> Headers:
    view = memoryview(raw)
    if len(view) < 4:
        raise FrameError("header block shorter than its pair count")
    (count,) = struct.unpack_from(">I", view, 0)
    offset = 4
    headers: Headers = {}
    for _ in range(count):
        name, offset = _string(view, offset)
        value, offset = _string(view, offset)
        if not name:
            raise FrameError("header block has an empty header name")
        key = name.decode("utf-8", "replace").lower()
        if key in headers:
            raise FrameError(f"header block repeats header {key!r}")
        headers[key] = value.decode("utf-8", "replace")
    if offset != len(view):
        raise FrameError("header block has bytes after its last pair")
    return headers


def _string(view: memoryview, offset: int) -> tuple[bytes, int]:
    if offset + 4 > len(view):
        raise FrameError("header block ends inside a length")
    (length,) = struct.unpack_from(">I", view, offset)
    offset += 4
    if offset + length > len(view):
        raise FrameError("header block ends inside a name or value")
    return bytes(view[offset:offset + length]), offset + length


def parse_head(head: bytes) -> FrameHead:
    """The first :data:`HEAD_SIZE` bytes of a frame."""
    if len(head) != HEAD_SIZE:
        raise FrameError(f"a frame head is {HEAD_SIZE} bytes, got {len(head)}")
    first, flags_length = struct.unpack(">II", head)
    flags, length = flags_length >> 24, flags_length & 0xFFFFFF
    if first & 0x80000000:
        return FrameHead(control=True, version=(first >> 16) & 0x7FFF, frame_type=first & 0xFFFF,
                         stream_id=0, flags=flags, length=length)
    return FrameHead(control=False, version=0, frame_type=0, stream_id=first & _MASK31,
                     flags=flags, length=length)


def decode(head: FrameHead, payload: bytes, *, codec: HeaderCodec) -> Frame:
    """The frame ``head`` + ``payload`` form. ``codec`` inflates header blocks (it must see
    every header block of the connection's inbound direction, in order)."""
    if len(payload) != head.length:
        raise FrameError(f"frame says {head.length} bytes, got {len(payload)}")
    if not head.control:
        return Data(stream_id=head.stream_id, data=payload, flags=head.flags)
    if head.version != VERSION:
        raise FrameError(f"SPDY version {head.version} is not {VERSION}")
    kind = head.frame_type
    if kind == _SYN_STREAM:
        _need(payload, 10, "SYN_STREAM")
        sid, assoc, pri = struct.unpack_from(">IIB", payload, 0)
        return SynStream(stream_id=sid & _MASK31, associated_to=assoc & _MASK31,
                         priority=pri >> 5, flags=head.flags,
                         headers=codec.unpack(payload[10:]))
    if kind in (_SYN_REPLY, _HEADERS):
        _need(payload, 4, "SYN_REPLY" if kind == _SYN_REPLY else "HEADERS")
        sid = struct.unpack_from(">I", payload, 0)[0] & _MASK31
        headers = codec.unpack(payload[4:])
        if kind == _SYN_REPLY:
            return SynReply(stream_id=sid, headers=headers, flags=head.flags)
        return HeadersFrame(stream_id=sid, headers=headers, flags=head.flags)
    if kind == _RST_STREAM:
        _exact(payload, 8, "RST_STREAM")
        sid, status = struct.unpack(">II", payload)
        return RstStream(stream_id=sid & _MASK31, status=status)
    if kind == _SETTINGS:
        _need(payload, 4, "SETTINGS")
        (count,) = struct.unpack_from(">I", payload, 0)
        _exact(payload, 4 + 8 * count, "SETTINGS")
        entries = []
        for i in range(count):
            id_flags, value = struct.unpack_from(">II", payload, 4 + 8 * i)
            entries.append((id_flags >> 24, id_flags & 0xFFFFFF, value))
        return Settings(entries=tuple(entries), flags=head.flags)
    if kind == _PING:
        _exact(payload, 4, "PING")
        return Ping(ping_id=struct.unpack(">I", payload)[0])
    if kind == _GOAWAY:
        _exact(payload, 8, "GOAWAY")
        last, status = struct.unpack(">II", payload)
        return GoAway(last_good_stream_id=last & _MASK31, status=status)
    if kind == _WINDOW_UPDATE:
        _exact(payload, 8, "WINDOW_UPDATE")
        sid, delta = struct.unpack(">II", payload)
        return WindowUpdate(stream_id=sid & _MASK31, delta=delta & _MASK31)
    return Unknown(frame_type=kind)


def _need(payload: bytes, size: int, what: str) -> None:
    if len(payload) < size:
        raise FrameError(f"{what} frame of {len(payload)} bytes is shorter than {size}")


def _exact(payload: bytes, size: int, what: str) -> None:
    if len(payload) != size:
        raise FrameError(f"{what} frame of {len(payload)} bytes, expected {size}")


def _control(kind: int, flags: int, payload: bytes) -> bytes:
    if len(payload) > 0xFFFFFF:
        raise FrameError(f"a frame carries at most {0xFFFFFF} bytes, got {len(payload)}")
    return struct.pack(">HHI", 0x8000 | VERSION, kind, (flags << 24) | len(payload)) + payload


def encode(frame: Frame, *, codec: HeaderCodec) -> bytes:
    """``frame`` on the wire. ``codec`` deflates header blocks (the outbound direction's)."""
    if isinstance(frame, Data):
        if len(frame.data) > 0xFFFFFF:
            raise FrameError(f"a frame carries at most {0xFFFFFF} bytes, got {len(frame.data)}")
        return struct.pack(">II", frame.stream_id & _MASK31,
                           (frame.flags << 24) | len(frame.data)) + frame.data
    if isinstance(frame, SynStream):
        return _control(_SYN_STREAM, frame.flags,
                        struct.pack(">IIBB", frame.stream_id & _MASK31,
                                    frame.associated_to & _MASK31, (frame.priority & 7) << 5, 0)
                        + codec.pack(frame.headers))
    if isinstance(frame, SynReply):
        return _control(_SYN_REPLY, frame.flags,
                        struct.pack(">I", frame.stream_id & _MASK31) + codec.pack(frame.headers))
    if isinstance(frame, HeadersFrame):
        return _control(_HEADERS, frame.flags,
                        struct.pack(">I", frame.stream_id & _MASK31) + codec.pack(frame.headers))
    if isinstance(frame, RstStream):
        return _control(_RST_STREAM, 0, struct.pack(">II", frame.stream_id & _MASK31,
                                                    frame.status))
    if isinstance(frame, Settings):
        body = struct.pack(">I", len(frame.entries)) + b"".join(
            struct.pack(">II", (flags << 24) | (key & 0xFFFFFF), value)
            for flags, key, value in frame.entries)
        return _control(_SETTINGS, frame.flags, body)
    if isinstance(frame, Ping):
        return _control(_PING, 0, struct.pack(">I", frame.ping_id))
    if isinstance(frame, GoAway):
        return _control(_GOAWAY, 0, struct.pack(">II", frame.last_good_stream_id & _MASK31,
                                                frame.status))
    if isinstance(frame, WindowUpdate):
        return _control(_WINDOW_UPDATE, 0, struct.pack(">II", frame.stream_id & _MASK31,
                                                       frame.delta & _MASK31))
    raise FrameError(f"cannot encode {type(frame).__name__}")
