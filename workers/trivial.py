"""The smallest possible target, for benchmarks: importing it costs next to nothing.

| function | does |
|---|---|
| `noop()` | returns None at once |
"""


def noop() -> None:
    """Return at once."""
    return None
