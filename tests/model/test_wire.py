"""The attempt channel's codec: framing, the value model, the schema (pure, no processes)."""

from __future__ import annotations

import itertools
import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpvisor._model.wire import (
    VERSION,
    Calling,
    Failure,
    FrameDecoder,
    Hello,
    Progress,
    ProtocolError,
    Ready,
    Result,
    Start,
    encode,
    encode_start,
    frame,
    pack,
    pack_call,
    parse,
    parse_start,
    start_size,
    unpack,
    unpack_start,
)

pytestmark = pytest.mark.unit

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=8) | st.binary(max_size=8), children, max_size=5),
    max_leaves=20,
)

messages = st.one_of(
    st.builds(Hello, pid=st.integers(min_value=1, max_value=2**31), v=st.just(VERSION)),
    st.just(Calling()),
    st.builds(
        Progress,
        done=st.integers(min_value=0, max_value=10**6) | st.floats(allow_nan=False, allow_infinity=False),
        total=st.none() | st.integers(min_value=0, max_value=10**6),
        message=st.none() | st.text(max_size=20),
    ),
    st.builds(Result, value=values),
    st.builds(
        Failure,
        kind=st.sampled_from(["fail", "fatal", "canceled", "error"]),
        reason=st.text(max_size=40),
        exit_code=st.none() | st.integers(min_value=-64, max_value=255),
        traceback=st.none() | st.text(max_size=40),
    ),
)


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@settings(max_examples=300, deadline=None)
@given(st.lists(messages, min_size=1, max_size=6), st.lists(st.integers(min_value=0), max_size=12))
def test_every_message_round_trips_under_any_chunking(batch, cuts):
    """Messages decode to themselves whatever the read boundaries."""
    stream = b"".join(encode(m) for m in batch)
    decoder = FrameDecoder(max_frame=1 << 20)
    decoded = []
    for chunk in _chunks(stream, cuts):
        decoded.extend(decoder.feed(chunk))
    decoder.finish()
    assert [parse(obj) for obj in decoded] == batch


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200), st.lists(st.integers(min_value=0), max_size=6))
def test_arbitrary_bytes_decode_or_raise_protocol_error(data, cuts):
    """Garbage decodes or raises ProtocolError, never anything else."""
    _decode_or_refuse(data, cuts, max_frame=64)


def _decode_or_refuse(data: bytes, cuts: list[int], max_frame: int) -> None:
    """Feed `data` in the chunks `cuts` makes, parsing each value: any complaint must be a
    `ProtocolError` (the test fails on any other exception)."""
    decoder = FrameDecoder(max_frame=max_frame)
    try:
        for chunk in _chunks(data, cuts):
            for obj in decoder.feed(chunk):
                parse(obj)
        decoder.finish()
    except ProtocolError:
        pass


def test_an_oversized_frame_is_refused_from_its_header_alone():
    """The declared length is checked before anything is buffered."""
    decoder = FrameDecoder(max_frame=1024)
    with pytest.raises(ProtocolError, match="exceeds max_frame_bytes=1024"):
        decoder.feed(struct.pack(">I", 1025))


@pytest.mark.parametrize(
    "stream, message",
    [
        (b"\x00\x00", "inside a 4-byte header"),
        (struct.pack(">I", 10) + b"abc", "after 3 of 10 bytes"),
    ],
)
def test_a_stream_cut_inside_a_frame_is_truncated(stream, message):
    """A truncated frame is a protocol error at end of stream."""
    decoder = FrameDecoder(max_frame=1024)
    assert decoder.feed(stream) == []
    with pytest.raises(ProtocolError, match=message):
        decoder.finish()


@pytest.mark.parametrize(
    "payload",
    [
        msgpack.packb(msgpack.ExtType(5, b"x")),
        msgpack.packb({1: "int key"}),
        b"\xa3\xff\xfe\xfd",  # a str that is not UTF-8
        b"\xc1",  # a byte msgpack never uses
        msgpack.packb(1) + msgpack.packb(2),  # two values in one frame
    ],
)
def test_undecodable_payloads_are_protocol_errors(payload):
    """Ext types and non-str/bytes keys are refused both ways."""
    with pytest.raises(ProtocolError):
        FrameDecoder(max_frame=1024).feed(frame(payload))


def test_bytes_and_str_stay_distinct_and_tuples_arrive_as_lists():
    """The value model: None, bool, int, float, str, bytes, list, tuple and str/bytes-keyed dict."""
    assert unpack(pack({"s": "x", "b": b"x", "t": (1, 2), b"k": None})) == {
        "s": "x",
        "b": b"x",
        "t": [1, 2],
        b"k": None,
    }


def test_ext_types_are_refused_when_encoding():
    """Nothing but plain msgpack values are sent."""
    with pytest.raises(TypeError):
        pack({"x": object()})


@pytest.mark.parametrize(
    "obj",
    [
        {"t": "hello", "v": 1},
        {"t": "hello", "v": 1, "pid": "7"},
        {"t": "result"},
        {"t": "failure", "kind": "oops", "reason": "", "exit_code": None, "traceback": None},
        {"t": "progress", "done": True, "total": None, "message": None},
        {"t": "ready"},
        {"t": "ready", "status": 3},
        {"t": "nonsense"},
        [1, 2, 3],
    ],
)
def test_messages_off_the_schema_are_protocol_errors(obj):
    """The schema is declared: a missing, extra or mistyped field is refused."""
    with pytest.raises(ProtocolError):
        parse(obj)


@pytest.mark.parametrize("status", [None, "accepting connections"])
def test_a_ready_message_round_trips(status):
    """`context().ready(status)`'s frame: the status text, or none."""
    assert parse(unpack(pack(Ready(status).to_wire()))) == Ready(status)


def test_a_message_may_be_limited_to_what_the_step_allows():
    """A result before the handshake is off-protocol."""
    with pytest.raises(ProtocolError, match="unexpected message"):
        parse(Result(1).to_wire(), ("hello",))


def test_the_start_message_carries_its_version():
    """The parent's start message round-trips and names the protocol version."""
    start = Start("t", 1, 2, "fn", "m:f", pack_call([1], {"a": b"x"}), [], None, None, None, 1024)
    assert parse_start(unpack(encode(start)[4:])) == start
    assert unpack(start.call) == [[1], {"a": b"x"}]
    with pytest.raises(ProtocolError):
        parse_start({**start.to_wire(), "v": 99})


@pytest.mark.parametrize("size", [0, 1, 255, 256, 65535, 65536, 3 * 2**20])
def test_the_start_frame_in_two_pieces_decodes_like_one_and_knows_its_size(size):
    """`encode_start` frames the call's bytes without copying them (bin 8/16/32 headers), and
    `start_size` is the body length the child reads."""
    call = pack_call([b"x" * size], {})
    start = Start("t", 1, 1, "fn", "m:f", call, [], {"K": "v"}, "/", ["/p"], 1024)
    head, body = encode_start(start)
    assert body is call
    data = head + body
    (length,) = struct.unpack(">I", data[:4])
    assert length == len(data) - 4 == start_size(start)
    assert parse_start(unpack(data[4:])) == start


@pytest.mark.parametrize("n", [0, 1, 14, 15, 16, 17, 2**16 - 1, 2**16, 2**16 + 1])
def test_a_map_header_is_msgpacks_own(n):
    """`encode_start` packs the other fields as one map and writes its header for one entry more
    (`call`): the header is msgpack's for every size class (fixmap, map 16, map 32)."""
    from mpvisor._model.wire import _map_header

    assert _map_header(n) == msgpack.Packer().pack_map_header(n)


def test_bytes_that_are_not_utf8_in_a_start_reach_the_child_as_they_were():
    """A program's argv, the environment, the working directory and `sys.path` come from the OS,
    where Python holds a byte that is not UTF-8 as a lone surrogate: the start frame carries it as
    that byte, and the child's decoder gives back the same text (encoding it raised
    UnicodeEncodeError: a user's report). What a child sends stays strict UTF-8."""
    odd = "caf\udce9"  # os.fsdecode(b"caf\xe9")
    start = Start("t", 1, 1, "cmd", "", pack_call([], {}), [odd, "x"], {"FOO": "\udcff\udcfe", odd: "v"},
                  f"/tmp/{odd}", [f"/p/{odd}"], 1024)
    head, body = encode_start(start)
    assert b"caf\xe9" in head
    assert unpack_start((head + body)[4:]) == start
    with pytest.raises(ProtocolError, match="undecodable"):
        unpack((head + body)[4:])


def test_the_decoder_holds_one_frame_and_never_copies_it():
    """A 16 MiB frame fed in 256 KiB chunks: the decoder's peak allocation is about the frame
    (buffered) plus the decoded value, never a third copy (the body is decoded where it lies)."""
    import tracemalloc

    from mpvisor._model.wire import FrameDecoder, frame, pack

    size = 16 * 2**20
    data = frame(pack(b"x" * size))
    decoder = FrameDecoder(32 * 2**20)
    chunks = [data[i : i + 2**18] for i in range(0, len(data), 2**18)]
    tracemalloc.start()
    try:
        got = [value for chunk in chunks for value in decoder.feed(chunk)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == [b"x" * size]
    assert peak < 2.3 * size, f"peak {peak / 2**20:.1f} MiB for a {size / 2**20:.0f} MiB frame"


# The densest frames there are: one array filling 256 KiB with copies of one element, each element the
# fewest bytes that make one new object. Empty maps are the worst (64-byte dicts from 1 byte).
DENSE = {"empty maps": b"\x80", "empty lists": b"\x90", "1-key maps": b"\x81\xa1a\x01",
         "pairs": b"\x92\x01\x02", "int8": b"\xd0\x80", "2-char str": b"\xa2ab", "fixints": b"\x01",
         "float32": b"\xca\x3f\x80\x00\x00"}
WORST_FACTOR = 75  # bytes the parent may hold per byte of a frame, frame included


@pytest.mark.parametrize("element", DENSE.values(), ids=DENSE.keys())
def test_a_decoded_frame_costs_at_most_75_times_its_bytes(element):
    """What a hostile child can make the parent hold with one frame is bounded by the frame: at
    most `WORST_FACTOR` times its bytes, the buffered frame included (measured with tracemalloc;
    so `max_frame_bytes` bounds an attempt's memory in the parent at about 75 times itself)."""
    import tracemalloc

    count = 2**18 // len(element)
    data = frame(b"\xdd" + struct.pack(">I", count) + element * count)
    decoder = FrameDecoder(2**21)
    tracemalloc.start()
    try:
        (value,) = decoder.feed(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(value) == count
    assert peak < WORST_FACTOR * len(data), f"{peak / len(data):.1f} bytes held per frame byte"


def test_nesting_deeper_than_the_decoder_allows_is_a_protocol_error():
    """100,000 nested one-element arrays: refused (msgpack's depth limit), not a crash."""
    with pytest.raises(ProtocolError, match="undecodable"):
        FrameDecoder(2**20).feed(frame(b"\x91" * 100_000 + b"\x01"))


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=1_000, max_size=40_000), st.lists(st.integers(min_value=0), max_size=20),
       st.sampled_from([64, 4096, 2**20]))
def test_large_arbitrary_streams_decode_or_raise_protocol_error(data, cuts, max_frame):
    """Tens of KiB of arbitrary bytes, in any chunking, under small and large frame limits."""
    _decode_or_refuse(data, cuts, max_frame)


@settings(max_examples=60, deadline=None)
@given(st.lists(messages, min_size=1, max_size=8), st.data())
def test_valid_streams_with_corrupted_bytes_decode_or_raise_protocol_error(batch, data):
    """A real stream of messages with bytes overwritten, inserted and deleted at random places:
    what survives decodes and parses, or the decoder says `ProtocolError`; nothing else."""
    stream = bytearray(b"".join(encode(m) for m in batch))
    for _ in range(data.draw(st.integers(min_value=1, max_value=8))):
        at = data.draw(st.integers(min_value=0, max_value=len(stream)))
        how = data.draw(st.sampled_from(["overwrite", "insert", "delete"]))
        byte = data.draw(st.integers(min_value=0, max_value=255))
        if how == "insert" or at == len(stream):
            stream[at:at] = bytes([byte])
        elif how == "overwrite":
            stream[at] = byte
        else:
            del stream[at]
    decoder = FrameDecoder(max_frame=2**16)
    try:
        for obj in decoder.feed(bytes(stream)):
            try:
                parse(obj)
            except ProtocolError:
                pass  # off the schema: the attempt is condemned; the decoder is not
        decoder.finish()
    except ProtocolError:
        pass
