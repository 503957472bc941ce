"""The control channel's codec: every message round-trips; anything else is a ControlError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpvisor._launchers.local import control
from mpvisor._model.wire import pack

pytestmark = pytest.mark.timeout(30)

V = control.CONTROL_VERSION
EXAMPLES = [
    control.Spawn(1, False), control.Spawn(2**40, True), control.Spawn(3, False, "pkg.jobs"), control.Signal(3, 15, True), control.Kill(4),
    control.Stop(), control.Importing(V, 123, "numpy"), control.Ready(V, 123, None),
    control.Ready(V, 123, "preload module 'x' failed to import: ImportError: no"), control.Started(5, 4242),
    control.StartFailed(6, "could not start: [Errno 11] Resource temporarily unavailable"),
    control.StartFailed(6, "could not start: child ended (signal 9)", "signal", 9, "cgroup v1"),
    control.Exited(7, "exit", 0, False), control.Exited(8, "signal", 9, True), control.Exited(9, "signal", 9, False, True),
    control.Spawn(10, False, "", True, control.NO_TERMINAL), control.Spawn(11, False, "pkg.jobs", True, control.FOREGROUND),
    control.Spawn(12, True, "", True, control.BACKGROUND), control.Stopped(13, 20),
    control.Spawn(14, False, "", False, control.NO_TERMINAL, 7), control.Fence(7, 1234.5, 1238.25),
    control.Fence(8, float("inf"), float("inf")), control.Unfence(7), control.Exited(15, "signal", 15, False, False, True),
    control.Spawn(16, False, "", False, control.NO_TERMINAL, 0, 256 * 2**20, "/sys/fs/cgroup/memory/x"),
    control.Spawn(19, False, "", False, control.NO_TERMINAL, 0, 0, "", "/sys/fs/cgroup/unified"),
    control.Spawn(20, False, "", False, control.NO_TERMINAL, 0, 0, "", "/sys/fs/cgroup/unified", 2.5),
    control.Exited(21, "signal", 9, False, False, False, "", "cgroup v2 cpu.stat", 1.03),
    control.Spawn(22, False, "", False, control.NO_TERMINAL, 0, 0, "", "/sys/fs/cgroup/unified", 0.0, 1.5, "/sys/fs/cgroup/cpu"),
    control.Spawn(17, False, "", False, control.NO_TERMINAL, 0, 2**20, ""), control.Exited(18, "signal", 9, False, True, False, "cgroup v1"),
    control.Spawn(23, False, "", True, control.FOREGROUND, passed=(3, 9, 255)),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_control_message_round_trips(message):
    """decode(encode(m)) == m, of the same type, for each kind of message."""
    decoded = control.decode(control.encode(message))
    assert (type(decoded), decoded) == (type(message), message)


@pytest.mark.parametrize(
    "packet",
    [
        ["spawn", 1], ["spawn", "1", True, ""], ["spawn", 1, 1, ""], ["spawn", 1, True], ["spawn", 1, True, 7], ["signal", 1, 15], ["kill"], ["stop", 1],
        ["started", 1], ["exited", 1, "vanished", 0, False], ["exited", 1, "exit", 0, 0], ["fence", 1, 2, 3.0], ["fence", 1, 2.0], ["unfence"],
        ["spawn", 1, False, "", False, 0, 0, -1, "", "", 0.0], ["spawn", 1, False, "", False, 0, 0, 0, "", ""],
        ["spawn", 1, False, "", False, 0, 0, 0, "", "", -1.0], ["exited", 1, "exit", 0, False, False, False, 7],
        ["ready", V, 1, 2], ["nonsense"], [], {"spawn": 1}, 7, None,
        ["spawn", 1, False, "", True, 0, 0, 0, "", "", 0.0, 0.0, "", [2]],  # a passed fd is above 2,
        ["spawn", 1, False, "", True, 0, 0, 0, "", "", 0.0, 0.0, "", [3, 3]],  # each number once,
        ["spawn", 1, False, "", True, 0, 0, 0, "", "", 0.0, 0.0, "", [True]],  # and a number
    ],
)
def test_a_malformed_or_unknown_packet_is_a_control_error(packet):
    """Wrong arity, wrong types, an unknown name or not a list at all: ControlError naming it."""
    with pytest.raises(control.ControlError, match="not a control message"):
        control.decode(pack(packet))


@pytest.mark.parametrize("packet", [["ready", V + 1, 1, None], ["importing", V + 1, 1, "m"], ["ready", 0, 1, None]])
def test_a_launcher_of_another_protocol_version_is_refused(packet):
    """The launcher's first message carries its version; another one is refused, naming both."""
    with pytest.raises(control.ControlError, match=f"version {packet[1]}, this parent {V}"):
        control.decode(pack(packet))


def test_undecodable_bytes_are_a_control_error_too():
    """Bytes that are not msgpack are refused like any bad packet (a ProtocolError)."""
    with pytest.raises(control.ProtocolError):
        control.decode(b"\xc1garbage")


_ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_messages = st.one_of(
    st.builds(control.Spawn, _ints, st.booleans(), st.text(), st.booleans(),
              st.sampled_from([control.NO_TERMINAL, control.BACKGROUND, control.FOREGROUND]), _ints,
              st.integers(min_value=0, max_value=2**63 - 1), st.text(), st.text(), st.floats(min_value=0, max_value=1e12),
              st.floats(min_value=0, max_value=1e6), st.text(),
              st.lists(st.integers(min_value=3, max_value=2**31 - 1), unique=True, max_size=8).map(tuple)),
    st.builds(control.Fence, _ints, st.floats(allow_nan=False), st.floats(allow_nan=False)),
    st.builds(control.Unfence, _ints),
    st.builds(control.Stopped, _ints, _ints),
    st.builds(control.Signal, _ints, _ints, st.booleans()),
    st.builds(control.Kill, _ints),
    st.builds(control.Importing, st.just(V), _ints, st.text()),
    st.builds(control.Ready, st.just(V), _ints, st.none() | st.text()),
    st.builds(control.Started, _ints, _ints),
    st.builds(control.StartFailed, _ints, st.text(), st.sampled_from(["", "exit", "signal"]), _ints,
              st.sampled_from(["", "cgroup v1", "watcher"]), st.sampled_from(["", "launcher accounting"])),
    st.builds(control.Exited, _ints, st.sampled_from(["exit", "signal"]), _ints, st.booleans(), st.booleans(), st.booleans(),
              st.sampled_from(["", "cgroup v1", "watcher"]), st.sampled_from(["", "cgroup v2 cpu.stat", "launcher accounting"]),
              st.floats(min_value=0, allow_infinity=False, allow_nan=False)),
)


@given(_messages)
def test_any_well_formed_message_round_trips(message):
    """Property: any field values of the right types survive encoding, and the type too."""
    decoded = control.decode(control.encode(message))
    assert (type(decoded), decoded) == (type(message), message)


@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_a_protocol_error(data):
    """Property: arbitrary bytes never raise anything but ProtocolError (ControlError included)."""
    try:
        control.decode(data)
    except control.ProtocolError:
        pass
