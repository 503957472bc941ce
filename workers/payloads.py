"""What arrived? Targets that summarise a (big) argument instead of sending it back.

| function | returns |
|---|---|
| `digest(data)` | `[len(data), sha256 hex of data]` (`data` is bytes) |
| `sizes(*args, **kwargs)` | `[[len(a) for a in args], {k: len(v)}]` |
"""

from __future__ import annotations

import hashlib


def digest(data: bytes) -> list[object]:
    """The length and SHA-256 of `data`, to check a big argument crossed intact."""
    return [len(data), hashlib.sha256(data).hexdigest()]


def sizes(*args: bytes, **kwargs: bytes) -> list[object]:
    """The lengths of every argument."""
    return [[len(a) for a in args], {k: len(v) for k, v in kwargs.items()}]
