"""How much pure-Python CPU work does one benchmark job do?

A fixed amount, given as an iteration count, so that every side of a benchmark (an mpvisor
attempt, a `ProcessPoolExecutor` worker, the calibrating parent) does exactly the same work.
Unlike `basic.cpu_burn`, nothing here reads a clock: a slower process takes longer, it does not
do less. `scripts/bench_cpu.py` calibrates the count once in the parent.

| function | does | returns |
|---|---|---|
| `burn(iterations)` | `iterations` steps of a 32-bit linear congruential generator, in pure Python | the final state (identical for identical counts) |
"""

from __future__ import annotations

_MULTIPLIER = 1103515245
_INCREMENT = 12345
_MASK = 0xFFFFFFFF


def burn(iterations: int) -> int:
    """Run `iterations` LCG steps (pure-Python integer arithmetic, no system calls); return the state.

    The amount of work is fixed by `iterations`, never by elapsed time; the result depends only
    on `iterations`, so callers can check that two runs did the same work.
    """
    if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 0:
        raise ValueError(f"iterations must be a non-negative int, got {iterations!r}")
    state = 1
    for _ in range(iterations):
        state = (state * _MULTIPLIER + _INCREMENT) & _MASK
    return state
