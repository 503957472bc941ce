"""How do commands wait for room in a bounded command queue, in the order they were issued?

`Intake` is the command queue of the registry and of the controller: a FIFO of at most
`capacity` commands, drained by one consumer loop with `take()` (it never awaits the queue; the
`wake` callback tells it a command entered, or a waiting producer gave up: whatever waits for
the queue to drain looks again), and filled by producers with `offer()` (room now,
or False: the `try_*` calls) or `put()` (wait for room). It replaces `asyncio.Queue`, whose getter
machinery the consumers did not use, and which lets a producer woken for a freed place lose it
to a later `put_nowait`. The controller's intake is also its hot path (a busy slot may reject
100,000 submissions a second).

Order and bounds:

- `take()` hands the freed place to the first waiting producer and reserves it, so a place is
  never promised twice and the queue never holds more than `capacity`;
- so a waiting producer is never overtaken: while anyone waits, every place is held or
  reserved and `offer()` refuses; commands enter in the order their callers asked;
- a producer canceled after its place was granted passes the place on to the next one.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Intake(Generic[T]):
    """A bounded FIFO with waiting producers and one non-blocking consumer."""

    __slots__ = ("_items", "_putters", "_reserved", "_wake", "capacity")

    def __init__(self, capacity: int, wake: Callable[[], None]) -> None:
        self.capacity = capacity
        self._items: collections.deque[T] = collections.deque()
        self._putters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._reserved = 0  # places granted to waiting producers that have not resumed yet
        self._wake = wake  # called after every item that enters, and when a waiting producer gives up

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"<Intake {len(self._items)}/{self.capacity} waiting={len(self._putters)} reserved={self._reserved}>"

    def drained(self) -> bool:
        """Nothing held, nobody waiting, no place promised: every command issued was taken."""
        return not (self._items or self._putters or self._reserved)

    def offer(self, item: T) -> bool:
        """Append `item` if there is a place nobody was promised (True); else False."""
        if len(self._items) + self._reserved >= self.capacity:
            return False
        self._items.append(item)
        self._wake()
        return True

    async def put(self, item: T) -> None:
        """Append `item`, waiting behind earlier producers for room."""
        if self.offer(item):
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._putters.append(granted)
        try:
            await granted
        except BaseException:
            if granted.done() and not granted.cancelled():
                self._reserved -= 1  # granted a place while being canceled: pass it on
            elif granted in self._putters:  # `_grant` may already have dropped it as done
                self._putters.remove(granted)
            self._grant()
            self._wake()  # one producer fewer: the intake may be drained now
            raise
        self._reserved -= 1
        self._items.append(item)
        self._wake()

    def take(self) -> T:
        """Remove and return the oldest item (IndexError when empty); grant its place."""
        item = self._items.popleft()
        self._grant()
        return item

    def _grant(self) -> None:
        while self._putters and len(self._items) + self._reserved < self.capacity:
            granted = self._putters.popleft()
            if not granted.done():
                granted.set_result(None)
                self._reserved += 1
