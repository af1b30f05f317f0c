"""SPDY/3.1 framing and header blocks (pure): every frame type round-trips, bad bytes are errors."""

from __future__ import annotations

import hashlib
import struct
import zlib

import pytest

from vkprovider.api.portforward import spdy
from vkprovider.api.portforward.dictionary import DICTIONARY, DICTIONARY_SHA256


def roundtrip(frame: spdy.Frame) -> spdy.Frame:
    wire = spdy.encode(frame, codec=spdy.HeaderCodec())
    head = spdy.parse_head(wire[:spdy.HEAD_SIZE])
    assert head.length == len(wire) - spdy.HEAD_SIZE
    return spdy.decode(head, wire[spdy.HEAD_SIZE:], codec=spdy.HeaderCodec())


@pytest.mark.parametrize("frame", [
    spdy.SynStream(stream_id=1, headers={"streamtype": "error", "port": "8000",
                                         "requestid": "0"}, priority=3),
    spdy.SynStream(stream_id=2**31 - 1, associated_to=5, flags=spdy.FLAG_FIN),
    spdy.SynReply(stream_id=3, headers={"x": "a\0b"}, flags=spdy.FLAG_FIN),
    spdy.HeadersFrame(stream_id=3, headers={"k": "v"}),
    spdy.RstStream(stream_id=7, status=spdy.RstStatus.REFUSED_STREAM),
    spdy.Settings(entries=((0, spdy.SETTINGS_INITIAL_WINDOW_SIZE, 10),
                           (1, spdy.SETTINGS_MAX_CONCURRENT_STREAMS, 100))),
    spdy.Ping(ping_id=2**32 - 1),
    spdy.GoAway(last_good_stream_id=9, status=2),
    spdy.WindowUpdate(stream_id=0, delta=2**31 - 1),
    spdy.Data(stream_id=5, data=b"\x00\xffhello", flags=spdy.FLAG_FIN),
    spdy.Data(stream_id=5),
])
def test_every_frame_type_round_trips(frame: spdy.Frame) -> None:
    assert roundtrip(frame) == frame


def test_wire_layout_follows_the_spec() -> None:
    codec = spdy.HeaderCodec()
    # control bit, version 3, type 6 (PING), no flags, length 4, id
    assert spdy.encode(spdy.Ping(ping_id=1), codec=codec) == bytes.fromhex(
        "80030006" "00000004" "00000001")
    # data frame: no control bit, stream id, FIN flag, length 2
    assert spdy.encode(spdy.Data(stream_id=3, data=b"hi", flags=spdy.FLAG_FIN),
                       codec=codec) == bytes.fromhex("00000003" "01000002") + b"hi"
    # WINDOW_UPDATE: type 9, length 8, stream id, delta
    assert spdy.encode(spdy.WindowUpdate(stream_id=1, delta=512), codec=codec) == bytes.fromhex(
        "80030009" "00000008" "00000001" "00000200")


def test_header_block_is_zlib_against_the_spdy3_dictionary() -> None:
    """Any zlib with the SPDY/3 dictionary inflates our blocks (not just our own codec)."""
    block = spdy.HeaderCodec().pack({"Port": "8000", "streamtype": "data"})
    raw = zlib.decompressobj(zdict=DICTIONARY).decompress(block)
    assert raw == (struct.pack(">I", 2) + struct.pack(">I", 4) + b"port" + struct.pack(">I", 4)
                   + b"8000" + struct.pack(">I", 10) + b"streamtype" + struct.pack(">I", 4)
                   + b"data")
    # and a block another zlib deflated with the dictionary is read by our codec
    deflate = zlib.compressobj(zdict=DICTIONARY)
    theirs = deflate.compress(raw) + deflate.flush(zlib.Z_SYNC_FLUSH)
    assert spdy.HeaderCodec().unpack(theirs) == {"port": "8000", "streamtype": "data"}


def test_header_compression_state_spans_a_direction() -> None:
    sender, receiver = spdy.HeaderCodec(), spdy.HeaderCodec()
    first = sender.pack({"port": "8000", "streamtype": "error", "requestid": "0"})
    second = sender.pack({"port": "8000", "streamtype": "data", "requestid": "0"})
    assert receiver.unpack(first)["streamtype"] == "error"
    assert receiver.unpack(second)["streamtype"] == "data"
    with pytest.raises(spdy.FrameError):  # the second block alone lacks the first's state
        spdy.HeaderCodec().unpack(second)


def test_the_dictionary_is_the_spec_one() -> None:
    assert len(DICTIONARY) == 1423
    assert hashlib.sha256(DICTIONARY).hexdigest() == DICTIONARY_SHA256
    assert DICTIONARY.startswith(b"\x00\x00\x00\x07options\x00\x00\x00\x04head")
    assert DICTIONARY.endswith(b"charset=iso-8859-1,utf-,*,enq=0.")


def test_a_header_bomb_is_refused() -> None:
    deflate = zlib.compressobj(zdict=DICTIONARY)
    big = struct.pack(">I", 1) + struct.pack(">I", 1) + b"a" + struct.pack(">I", 10**6) + \
        b"x" * 10**6
    block = deflate.compress(big) + deflate.flush(zlib.Z_SYNC_FLUSH)
    assert len(block) < 5000
    with pytest.raises(spdy.FrameError, match="inflates to more than"):
        spdy.HeaderCodec().unpack(block)


@pytest.mark.parametrize("raw", [
    b"",  # no pair count
    struct.pack(">I", 1) + struct.pack(">I", 5) + b"ab",  # name cut short
    struct.pack(">I", 1) + struct.pack(">I", 0) + struct.pack(">I", 0),  # empty name
    struct.pack(">I", 2) + (struct.pack(">I", 1) + b"a") * 4,  # a repeated name
    struct.pack(">I", 0) + b"junk",  # bytes after the last pair
])
def test_malformed_header_blocks_are_frame_errors(raw: bytes) -> None:
    deflate = zlib.compressobj(zdict=DICTIONARY)
    block = deflate.compress(raw) + deflate.flush(zlib.Z_SYNC_FLUSH)
    with pytest.raises(spdy.FrameError):
        spdy.HeaderCodec().unpack(block)


def test_garbage_and_wrong_versions_are_frame_errors() -> None:
    with pytest.raises(spdy.FrameError, match="does not inflate"):
        spdy.HeaderCodec().unpack(b"not zlib at all")
    v2 = spdy.parse_head(bytes.fromhex("80020006" "00000004"))
    with pytest.raises(spdy.FrameError, match="version 2"):
        spdy.decode(v2, b"\x00\x00\x00\x01", codec=spdy.HeaderCodec())
    ping = spdy.parse_head(bytes.fromhex("80030006" "00000003"))
    with pytest.raises(spdy.FrameError, match="PING"):
        spdy.decode(ping, b"\x00\x00\x01", codec=spdy.HeaderCodec())
    with pytest.raises(spdy.FrameError):
        spdy.parse_head(b"\x80\x03")


def test_unknown_control_types_are_skippable() -> None:
    head = spdy.parse_head(bytes.fromhex("8003000a" "00000002"))  # CREDENTIAL (type 10)
    assert spdy.decode(head, b"ab", codec=spdy.HeaderCodec()) == spdy.Unknown(frame_type=10)
