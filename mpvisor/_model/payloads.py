"""Can this value cross to a child process and back?

Owns the msgpack value model: which Python values a task's arguments, keyword
arguments and return value may hold. It only checks; encoding and decoding belong to the wire
codec. The check walks the value with an explicit stack, so a deeply nested (or
self-containing) value gives a `TypeError`, never a `RecursionError`.

| value | accepted |
|---|---|
| `None`, `bool`, `float`, `str`, `bytes` | yes |
| `int` | in [-2**63, 2**64 - 1] |
| `list`, `tuple` (arrives as a list) | yes, if every item is accepted |
| `dict` | keys `str` or `bytes`, every value accepted |
| nesting deeper than `MAX_DEPTH` (511) containers | no (a frame holds ~1024 levels in all) |
| anything else (`set`, `bytearray`, objects, ...) | no |

Every refusal is a `TypeError` naming where the value sits (`args[1]`, `kwargs['x']`,
`args[0][2]['k']`) and what it is.
"""

from __future__ import annotations

INT_MIN = -(2**63)
INT_MAX = 2**64 - 1
MAX_DEPTH = 511  # msgpack packs and unpacks ~1024 levels per frame; leave room for the frame

_SCALARS = (type(None), bool, float, str, bytes)
_PLAIN = frozenset(_SCALARS)  # exactly these types (not subclasses): accepted without a path
_REPR_LIMIT = 80


def check_value(value: object, where: str) -> None:
    """Raise `TypeError` naming `where` if `value` (or anything inside it) is not msgpack.

    An item of a list or tuple whose type is exactly a plain scalar, or an int in range, is
    accepted where it is met, without making its path: a list of a million numbers costs a
    type test each, not a million formatted paths (which made a big argument cost seconds)."""
    stack: list[tuple[object, str, int]] = [(value, where, 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, _SCALARS):
            continue
        if isinstance(item, int):
            _check_int(item, path)
        elif isinstance(item, (list, tuple)):
            _check_depth(depth, path)
            for i, child in enumerate(item):
                kind = type(child)
                if kind in _PLAIN or (kind is int and INT_MIN <= child <= INT_MAX):
                    continue
                stack.append((child, f"{path}[{i}]", depth + 1))
        elif isinstance(item, dict):
            _check_depth(depth, path)
            stack.extend(_dict_items(item, path, depth))
        else:
            raise TypeError(
                f"{path} is not a msgpack value: {_short_repr(item)} of type "
                f"{type(item).__name__} (allowed: None, bool, int, float, str, bytes, list, "
                "tuple, dict with str or bytes keys)"
            )


def _check_int(value: int, path: str) -> None:
    if not INT_MIN <= value <= INT_MAX:
        raise TypeError(
            f"{path} is an int out of msgpack's range [-2**63, 2**64-1]: {_short_repr(value)}"
        )


def _check_depth(depth: int, path: str) -> None:
    if depth >= MAX_DEPTH:
        where = path if len(path) <= 60 else f"{path[:40]}…{path[-16:]}"  # its start names the argument
        raise TypeError(f"{where} is nested deeper than {MAX_DEPTH} containers (or contains itself)")


def _dict_items(
    mapping: dict[object, object], path: str, depth: int
) -> list[tuple[object, str, int]]:
    items: list[tuple[object, str, int]] = []
    for key, child in mapping.items():
        if not isinstance(key, (str, bytes)):
            raise TypeError(
                f"{path} has a key that is not str or bytes: {_short_repr(key)} of type "
                f"{type(key).__name__}"
            )
        kind = type(child)
        if kind in _PLAIN or (kind is int and INT_MIN <= child <= INT_MAX):  # type: ignore[operator]
            continue  # accepted where it is met, as a list's items are
        items.append((child, f"{path}[{key!r}]", depth + 1))
    return items


def _short_repr(value: object) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # a broken __repr__ must not hide the real problem
        text = f"<unrepresentable: {type(exc).__name__}>"
    return text if len(text) <= _REPR_LIMIT else text[: _REPR_LIMIT - 3] + "..."
