"""Is this setting acceptable?

Small checks shared by every constructor. Each raises at once with a message that names the
field and the value, so that bad input never reaches the runtime.

| check | accepts | refuses |
|---|---|---|
| `duration` | a finite real number >= 0 (> 0 without `allow_zero`; `real`), a `timedelta` (and `None` where allowed) | negative (and 0 without `allow_zero`), NaN, inf, bool, other types; the message states the field's rule |
| `positive_int` | an integer >= 1 (`whole`), and <= `most` where given (`MOST_LIMIT`, 2**63 - 1, for a limit's count) (and `None` where allowed) | 0, negatives, more than `most`, bool, other types |
| `size` | a whole number of bytes from 1 to `MOST_LIMIT` (2**63 - 1): an integer (`whole`), or a real number with no fraction (`integral`: `1e9`, `1024.0`, `Decimal("1E+9")`), as `mpvisor run --memory 1e9` and a task file's `memory = 1e9` take it (and `None` where allowed) | a fraction of a byte (`1.5`), 0, negatives, more, NaN, inf, bool, other types |
| `non_negative_int` | an integer >= 0 (`whole`) (and `None` where allowed) | negatives, bool, other types |
| `cpus` | a finite real number from 0.01 to `MOST_CPUS` (100000) (`real`) (and `None` where allowed) | less (below the kernel's least CPU quota: 1 ms per 100 ms), more, NaN, inf, bool, other types |
| `name` | a non-empty `str` | anything else |
| `ray_address` (`is_ray_address`) | `auto`, `local`, `HOST:PORT`, `ray://HOST[:PORT]` (a port from 1 to 65535; a host without `/` or whitespace) | anything else: `ray://` with no host, a URL of another scheme, a bad port |
| `cgroups_off` | a value of `$MPVISOR_CGROUPS`: unset or empty (False), `off`, `0`, `no`, `false`, `none` in any case (True) | any other value, `on` and `1` too (the variable only turns cgroups off) |

Numbers come as users have them: an integer setting takes any integer type (`whole`: one with
`__index__`, numpy's too), a size any whole number (`integral`), a number of seconds or CPUs any
real number (`real`: a `Fraction`, a `Decimal`, numpy's floats); what is stored is a plain `int`
or `float`, so nothing downstream (the wire, a `repr`, a comparison) meets another type. A
message shows a refused value shortened (`shown`: a 401-digit integer is not echoed whole), and
a finite number too large for a float (`10**400` seconds) is said to be too large, not infinite.
"""

from __future__ import annotations

import math
import operator
from datetime import timedelta

from mpvisor._model.errors import ConfigError


def whole(value: object) -> int | None:
    """`value` as a plain `int` if it is an integer of any type (`operator.index` takes it: an
    int, numpy's integers), else None; a bool is no integer here (`True` is no count)."""
    if type(value) is int:
        return value
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]  # what has no `__index__` raises
    except TypeError:
        return None


def real(value: object) -> float | None:
    """`value` as a `float` if it is a real number of any type (an int, a float, a `Fraction`, a
    `Decimal`, numpy's: what has `__float__` or `__index__`), else None; a bool, a str (which
    `float()` would parse) and a complex are not. NaN and the infinities stay: the caller's
    range refuses them, in its own words. Neither `numbers` nor `decimal` is imported: a
    setting's check is on every program's path."""
    if type(value) is float:
        return value
    kind = type(value)
    if isinstance(value, bool) or not (hasattr(kind, "__float__") or hasattr(kind, "__index__")):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except OverflowError:  # an int past a float's range: out of every range
        return math.inf
    except (TypeError, ValueError):  # `Decimal("sNaN")`, or a `__float__` that refuses
        return math.nan


def integral(value: object) -> int | None:
    """`value` as a plain `int` if it is a whole number of any type: an integer (`whole`), or a
    real number with no fraction (`1e9`, `1024.0`, `Decimal("1E+9")`, `Fraction(4, 2)`: read
    exactly, by its `as_integer_ratio`, once `real` says it is within 2**64, so that no huge
    `Decimal` is ever expanded), else None: `1.5`, NaN, an infinity, one past 2**64, a bool, a str."""
    number = whole(value)
    if number is not None or isinstance(value, bool):
        return number
    approximately = real(value)
    if approximately is None or not abs(approximately) <= 2**64:  # NaN too
        return None
    try:
        numerator, denominator = value.as_integer_ratio()  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError, OverflowError, ArithmeticError):
        return None
    return int(numerator) if denominator == 1 else None


def _too_large(value: object, number: float) -> bool:
    """Whether `number`, `real(value)`, is infinite only because `value` is a finite number past
    a float's range (`10**400`, `Decimal("1e400")`), not an infinity."""
    try:
        return math.isinf(number) and bool(value > 0) and bool(value != math.inf)  # type: ignore[operator]
    except (TypeError, ArithmeticError):
        return False


def duration(field: str, value: object, *, allow_none: bool = False, allow_zero: bool = True) -> float | None:
    """Return `value` as seconds, or raise `ConfigError` naming `field` and `value`."""
    if value is None and allow_none:
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif (number := real(value)) is not None:
        seconds = number
    else:
        raise ConfigError(f"{field} must be a number of seconds or a timedelta, got {shown(value)}")
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        rule = ">= 0" if allow_zero else "> 0"  # one message, the field's own rule, for every refused value
        got = f"a number too large: {shown(value)}" if _too_large(value, seconds) else shown(value)
        raise ConfigError(f"{field} must be a finite number of seconds {rule}, got {got}")
    return seconds


def positive_int(field: str, value: object, *, allow_none: bool = False, most: int | None = None) -> int | None:
    """Return `value` as an int if it is an integer >= 1 (`whole`; and <= `most`, where given; or
    an allowed `None`), else raise `ConfigError`."""
    if value is None and allow_none:
        return None
    number = whole(value)
    if number is None or number < 1 or (most is not None and number > most):
        rule = "a positive integer" if most is None else f"an integer from 1 to {most}"
        raise ConfigError(f"{field} must be {rule}, got {shown(value)}")
    return number


# The most a limit counted in whole units (bytes, descriptors) may be: what the kernel takes
# wherever one goes (`setrlimit` as CPython passes it, a C long; a cgroup's memory limit) and
# the attempt's start message carries (msgpack's 64 bits). In bytes, 8 EiB - 1: more than any
# machine has, so the bound costs nothing.
MOST_LIMIT = 2**63 - 1


def size(field: str, value: object, *, allow_none: bool = False) -> int | None:
    """Return `value` as an int if it is a whole number of bytes (`integral`) from 1 to
    `MOST_LIMIT` (or an allowed `None`), else raise `ConfigError` naming `field` and `value`."""
    if value is None and allow_none:
        return None
    number = integral(value)
    if number is None or not 1 <= number <= MOST_LIMIT:
        raise ConfigError(f"{field} must be a whole number of bytes from 1 to 2**63 - 1, got {shown(value)}")
    return number


def non_negative_int(field: str, value: object, *, allow_none: bool = False) -> int | None:
    """Return `value` as an int if it is an integer >= 0 (`whole`; or an allowed `None`), else
    raise `ConfigError`."""
    if value is None and allow_none:
        return None
    number = whole(value)
    if number is None or number < 0:
        raise ConfigError(f"{field} must be a non-negative integer, got {value!r}")
    return number


LEAST_CPUS = 0.01  # the kernel's least CFS quota, 1 ms, in its default period of 100 ms
# The most: more CPUs than any Linux host has (the kernel counts at most 8192), and a quota
# (10**10 us per 100 ms period) that every supported kernel takes: Linux >= 5.8 refuses one
# over 2**44 - 1 us (`cpus` 175921860), and before 5.8 a quota over 2**44 ns overflowed its
# arithmetic unchecked.
MOST_CPUS = 100_000


def cpus(field: str, value: object, *, allow_none: bool = False) -> float | None:
    """Return `value` as a number of CPUs (a fraction allowed), or raise `ConfigError`."""
    if value is None and allow_none:
        return None
    number = real(value)
    if number is None:
        raise ConfigError(f"{field} must be a number of CPUs, got {value!r}")
    if not math.isfinite(number) or not LEAST_CPUS <= number <= MOST_CPUS:
        raise ConfigError(f"{field} must be a number of CPUs from {LEAST_CPUS} to {MOST_CPUS}, got {shown(value)}")
    return number


NAME_MAX = 256  # characters of a name (a task's, a slot's): what the slot server's protocol carries


def quoted(text: str) -> str:
    """`repr(text)`, but for a byte that is not UTF-8, which Python holds as a lone surrogate
    (`os.fsdecode`: a Latin-1 file name), shown as the byte (`'caf\\xe9'`, as a program's name
    shows it), not as the surrogate (`'caf\\udce9'`). Pure."""
    text_repr = repr(text)
    if not any("\udc80" <= char <= "\udcff" for char in text):
        return text_repr
    quote = text_repr[0]  # the quote repr chose
    return quote + "".join(_quoted_char(char, quote) for char in text) + quote


def _quoted_char(char: str, quote: str) -> str:
    if "\udc80" <= char <= "\udcff":  # `surrogateescape`'s stand-in for the byte 0x80-0xff
        return f"\\x{ord(char) - 0xdc00:02x}"
    if char == quote:
        return "\\" + quote
    return char if char in "'\"" else repr(char)[1:-1]


def shown(value: object, most: int = 60) -> str:
    """`repr(value)` as a message quotes it (a str as `quoted` does): cut past `most`
    characters, saying its length (a message never echoes a multi-kilobyte value whole)."""
    text = quoted(value) if isinstance(value, str) else repr(value)
    if len(text) <= most:
        return text
    return f"{text[:most]}… ({len(value) if isinstance(value, str) else len(text)} characters)"


def name_problem(value: str) -> str | None:
    """What is wrong with `value` as a name (a task's, a slot's): `"empty"`, `"long"` or
    `"unprintable"`, or None. The one rule, which the model (`name`) and the CLI's options
    (`_cli/options.py`) both apply: a name is non-empty, at most `NAME_MAX` characters, and
    printable (it is printed on one line of a log, an outcome line or a table: no control
    character, line or paragraph separator, or lone surrogate)."""
    if not value:
        return "empty"
    if len(value) > NAME_MAX:
        return "long"
    return None if value.isprintable() else "unprintable"


_NAME_MUST = {"empty": "be a non-empty string", "long": f"be at most {NAME_MAX} characters",
              "unprintable": "be printable (no control characters or line breaks)"}


def name(field: str, value: object) -> str:
    """Return `value` if it is a name (`name_problem`), else raise `ConfigError` naming `field`
    (`TypeError` for a value that is no string)."""
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a non-empty string, got {shown(value)}")
    problem = name_problem(value)
    if problem is not None:
        raise ConfigError(f"{field} must {_NAME_MUST[problem]}, got {shown(value)}")
    return value


RAY_ADDRESS_FORMS = "auto, local, HOST:PORT or ray://HOST[:PORT]"


def is_ray_address(text: str) -> bool:
    """Whether `text` has a form of `RAY_ADDRESS_FORMS`: the one rule, which `RayLauncher` and
    `mpvisor run --ray` (`_cli/options.py`) both apply, so that an address Ray cannot use (`ray://`
    with no host, where Ray's client waits for nobody until the start timeout) is refused at
    once. A port is from 1 to 65535; a host has no `/` and no whitespace (`[...]` for IPv6)."""
    if text in ("auto", "local"):
        return True
    client, host, port = _ray_parts(text)
    if not (client and port is None) and not (port is not None and port.isdigit() and 0 < int(port) < 65536):
        return False
    return bool(host) and "/" not in host and not any(c.isspace() for c in host)


def _ray_parts(text: str) -> tuple[bool, str, str | None]:
    """Whether `text` is a `ray://` address, its host and its port (None: a `ray://` address
    without one, the client server's default); the one reading of both rules here."""
    client = text.startswith("ray://")
    rest = text.removeprefix("ray://")
    host, colon, port = rest.rpartition(":")
    if client and (not colon or host.count("[") != host.count("]")):  # no port ([::1] alone has colons)
        return True, rest, None
    return client, host, port


RAY_CLIENT_PORT = 10001  # Ray's client server's default port (`ray start --ray-client-server-port`)


def with_client_port(address: str | None) -> str | None:
    """A `ray://HOST` address with the client server's default port added, `ray://HOST:10001`
    (Ray's client adds none, and waits for nobody at HOST until the start timeout); any other
    address as given."""
    if address is None:
        return None
    client, _, port = _ray_parts(address)
    return f"{address}:{RAY_CLIENT_PORT}" if client and port is None else address


def ray_address(field: str, value: object) -> str:
    """Return `value` if it is a Ray address (`is_ray_address`), else raise `ConfigError` naming `field`."""
    if not isinstance(value, str) or not is_ray_address(value):
        raise ConfigError(f"{field} must be a Ray address ({RAY_ADDRESS_FORMS}) or None, got {shown(value)}")
    return value


CGROUPS_VARIABLE = "MPVISOR_CGROUPS"
CGROUPS_OFF = ("off", "0", "no", "false", "none")  # its values that turn cgroups off, in any case


def cgroups_off(text: str | None) -> bool:
    """Whether `text`, a value of `$MPVISOR_CGROUPS` (None: unset), turns cgroups off: True for
    a word of `CGROUPS_OFF` in any case, False when unset or empty. Any other value raises
    `ConfigError` naming the variable: it is never silently read as either."""
    word = (text or "").strip()
    if word.lower() in CGROUPS_OFF:
        return True
    if not word:
        return False
    raise ConfigError(f"${CGROUPS_VARIABLE}: expected one of {', '.join(CGROUPS_OFF)} (in any case) to make no cgroup, "
                      f"or nothing (unset or empty) to make them where the host allows, got {text!r}")
