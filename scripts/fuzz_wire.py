"""Fuzz what the parent decodes from a child, for as long as you let it run (extra `fuzz`).

    pip install -e '.[fuzz]'
    python scripts/fuzz_wire.py -max_total_time=600          # libFuzzer options pass through
    python scripts/fuzz_wire.py -runs=20000 corpus_dir/       # a fixed number of inputs

Each input is a stream of bytes from a hostile attempt process. The harness feeds it to the
parent's `FrameDecoder` in chunks whose sizes the input's first byte chooses, parses every
decoded value against the message schema, and checks what the contract says: the decoder
returns values or raises `ProtocolError`, nothing else; a message it accepts re-encodes to a
frame that decodes to the same message; and the decoder never buffers more than one frame plus
one chunk. Any other exception, or a broken check, is a crash libFuzzer reports with the input
that caused it. (What a decoded frame costs is measured, for the densest frames there are, by
`tests/model/test_wire.py::test_a_decoded_frame_costs_at_most_75_times_its_bytes`.)

`atheris` instruments `mpvisor._model.wire` and msgpack's pure-Python parts; its coverage guidance is
what the hypothesis tests in `tests/model/test_wire.py` do not have, so long runs here find what a
short property test cannot.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from mpvisor._model.wire import FrameDecoder, ProtocolError, encode, parse

MAX_FRAME = 1 << 16


def one_input(data: bytes) -> None:
    if not data:
        return
    chunk = 1 + data[0] * 7  # 1 .. 1786 bytes a read
    stream = data[1:]
    decoder = FrameDecoder(MAX_FRAME)
    try:
        for at in range(0, len(stream), chunk):
            for obj in decoder.feed(stream[at : at + chunk]):
                try:
                    message = parse(obj)
                except ProtocolError:
                    continue  # off the schema: the attempt would be condemned
                again = FrameDecoder(MAX_FRAME).feed(encode(message))
                if [parse(o) for o in again] != [message]:
                    raise AssertionError(f"{message!r} does not survive a re-encoding")
            if len(decoder._buf) > MAX_FRAME + chunk + 4:
                raise AssertionError(f"the decoder holds {len(decoder._buf)} bytes")
        decoder.finish()
    except ProtocolError:
        pass


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
