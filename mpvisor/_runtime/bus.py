"""Who hears about an event, and what may that cost the runtime?

Owns publishing: `seq` and `at`, the never-lossy `is_alive` view, one bounded queue and one
daemon thread per subscriber, the bounded queues of `events()` iterators, the throttled reports
of subscriber trouble, and the bounded drain at shutdown. It leaves what to publish, and when,
to the runtime; events never drive membership, outcomes or slot ownership.

`publish` runs on the runtime's loop and never blocks: it appends to each queue or drops the
event for that consumer alone. Subscriber trouble is counted per subscriber and per kind and
reported at most once per `TROUBLE_INTERVAL` seconds: the first trouble after a quiet second is
reported on the next loop iteration, later trouble is coalesced into one report that a loop
timer (`call_later`) publishes when the second is over, so every count is reported while the
bus is open. A count still waiting for its second when `close` begins is dropped with its
timer, and trouble during the final drain is not reported: no event may follow the runtime's
last one, and reporting early would break the once-a-second promise. A panic is seen on the subscriber's thread and hops to the loop with
`call_soon_threadsafe`.

| situation | effect |
|---|---|
| a subscriber's queue is full | the event is dropped for it alone; `SUBSCRIBER_OVERFLOW` counts the losses |
| `on_event` raises anything (`SystemExit`, `KeyboardInterrupt` too) | it keeps receiving; `SUBSCRIBER_PANICKED` counts the raises |
| `on_event` raises on a `SUBSCRIBER_PANICKED` or `SUBSCRIBER_OVERFLOW` (about another subscriber) | a WARNING on `mpvisor.bus`, no event: two subscribers that raise on everything would otherwise report each other's panics once a second without end |
| a trouble report about subscriber S | delivered to every consumer but S; when there is no other, a WARNING on `mpvisor.bus` says it instead (a lone subscriber that lost events was told by nobody) |
| a subscriber's thread cannot start (a limit on processes), at the first `publish` | it receives no events, and a WARNING on `mpvisor.bus` says so; the publisher goes on |
| an `events()` queue is full | the event is dropped for that iterator alone, silently |
| `publish` after `close` began | `seq` and the alive view advance; nobody receives it |
| nobody observes (no subscriber, no live iterator) | the event is not even built; `seq` and the alive view advance |
| `close(timeout)` | stop intake, end iterators, let threads drain for at most `timeout` in total, then abandon what is left; a subscriber's `close()` (if any) is called on its own thread |
| a subscriber still busy when `close`'s `timeout` ends | its undelivered events (the queued ones and the one in `on_event`) are dropped: a WARNING on `mpvisor.bus` counts them |
| the end of `close`, for a subscriber that lost events (to a full queue during the run, or undelivered at the deadline) | its `abandoned(count)` (if any) is called once with all of them, on the loop's thread |
| a subscriber's own thread waits for the shutdown (its `on_event` closed a blocking handle: `waits_for_close`) | the drain does not wait for it (it could never drain while it waits for the drain); once the shutdown returns to it, its thread delivers what is queued and calls its `close()`, after the loop's end |
| the program's own close of that handle (its `with` block, `close()`, or the program's end: `finish_late_drains`) | waits for that subscriber's thread, for at most `subscriber_shutdown_timeout`: the program's end would cut it short; one still busy then gets a WARNING on `mpvisor.bus` counting the events it has not delivered |

One module on purpose: the queue, its thread and the throttle exist only for the bus.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Literal, Protocol

from mpvisor import _platform
from mpvisor._model import checks as _validate
from mpvisor._model.events import ATTEMPT_TERMINAL_KINDS, Event, EventKind
from mpvisor._model.records import record

DEFAULT_QUEUE_CAPACITY = 1024
TROUBLE_INTERVAL = 1.0  # seconds between two reports of one kind about one subscriber
_log = logging.getLogger("mpvisor.bus")


_SEQ = itertools.count(1)  # `seq` increases process-wide, across supervisors
_TROUBLE_KINDS = frozenset({EventKind.SUBSCRIBER_PANICKED, EventKind.SUBSCRIBER_OVERFLOW})
_ALIVE_KINDS = ATTEMPT_TERMINAL_KINDS | {EventKind.ATTEMPT_STARTING, EventKind.TASK_FINISHED}


def _call_soon(
    loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: object
) -> None:
    """Schedule `callback` on `loop` from any thread; a closed loop has nobody left to tell."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, *args)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Subscriber(Protocol):
    """Anything with a `name` and `on_event`; `queue_capacity`, `close()` and
    `abandoned(count)` are optional (docs/events.md). A type for annotations only: a subscriber
    need not derive from it."""

    @property
    def name(self) -> str:
        """The subscriber's name, in the reports about it (`SUBSCRIBER_OVERFLOW`, ...)."""
        ...

    def on_event(self, event: Event) -> None:
        """Called with each event, in `seq` order, on the subscriber's own thread."""
        ...


@record(slots=True)
class _Throttle:
    """Coalesces one kind of trouble about one subscriber into at most one report an interval.

    Pure: `note` says how long to wait before reporting (None: a report is already scheduled);
    `take` hands over the count when the report is made.
    """

    interval: float
    count: int = 0  # troubles since the previous report
    detail: str = ""  # the latest trouble's description
    last_report: float | None = None  # loop time of the previous report
    pending: bool = False  # a report is scheduled and will carry `count`

    def note(self, count: int, detail: str, now: float) -> float | None:
        self.count += count
        self.detail = detail or self.detail
        if self.pending:
            return None
        self.pending = True
        if self.last_report is None:
            return 0.0
        return max(0.0, self.last_report + self.interval - now)

    def take(self, now: float) -> tuple[int, str]:
        count, self.count, self.pending, self.last_report = self.count, 0, False, now
        return count, self.detail


class EventStream:
    """The async iterator `Bus.events()` returns: events published after its creation."""

    __slots__ = ("__weakref__", "_buffer", "_capacity", "_ended", "_wakeup", "dropped")

    def __init__(self, capacity: int) -> None:
        self._buffer: deque[Event] = deque()
        self._capacity = capacity
        self._ended = False  # set by the bus at close; the iterator ends once `_buffer` is empty
        self._wakeup = asyncio.Event()
        self.dropped = 0  # events lost because the buffer was full

    def _offer(self, event: Event) -> None:
        if len(self._buffer) >= self._capacity:
            self.dropped += 1
            return
        self._buffer.append(event)
        self._wakeup.set()

    def _end(self) -> None:
        self._ended = True
        self._wakeup.set()

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        while not self._buffer:
            if self._ended:
                raise StopAsyncIteration
            self._wakeup.clear()
            await self._wakeup.wait()
        return self._buffer.popleft()

    def __repr__(self) -> str:
        state = "ended" if self._ended else "open"
        return f"<EventStream {state} buffered={len(self._buffer)} dropped={self.dropped}>"


def checked_subscriber(subscriber: object) -> tuple[str, int]:
    """A subscriber's name and queue capacity; `TypeError` for an object without a `name`
    string and an `on_event` method, or with an `async def` one (its thread would only make
    coroutines that nobody awaits: the subscriber would see nothing), `ConfigError` for a bad
    name or `queue_capacity`."""
    if not callable(getattr(subscriber, "on_event", None)) or not isinstance(getattr(subscriber, "name", None), str):
        raise TypeError(f"subscriber {subscriber!r} needs a `name` string and an `on_event(event)` method")
    for method in ("on_event", "close", "abandoned"):
        if inspect.iscoroutinefunction(getattr(subscriber, method, None)):
            raise TypeError(
                f"subscriber {subscriber.name!r}: {method}() is an `async def`, but a subscriber's methods are "  # type: ignore[attr-defined]
                "called on its own thread, where nothing would await it: make it a plain `def` (to reach an "
                "event loop from it, use loop.call_soon_threadsafe), or read `handle.events()` on the loop")
    name = _validate.name("subscriber.name", subscriber.name)  # type: ignore[attr-defined]
    capacity = getattr(subscriber, "queue_capacity", DEFAULT_QUEUE_CAPACITY)
    return name, _validate.positive_int(f"{name}.queue_capacity", capacity) or 1


class _Mailbox:
    """One subscriber's bounded queue and the daemon thread that empties it in `seq` order."""

    def __init__(self, subscriber: Subscriber, on_panic: Callable[[_Mailbox, str], None]) -> None:
        self.subscriber = subscriber
        self.name, self.capacity = checked_subscriber(subscriber)
        self._on_panic = on_panic
        self._items: deque[Event] = deque()  # never longer than `capacity`
        self._cond = threading.Condition()
        self._phase: Literal["open", "draining", "abandoned"] = "open"
        self._delivering = False  # True while `on_event` runs (on the subscriber's thread)
        self._thread = threading.Thread(
            target=self._run, name=f"mpvisor-sub-{self.name}", daemon=True
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self.done: asyncio.Future[None] | None = None  # resolved on the loop when the thread ends
        self.waits_for_close = False  # its thread waits for the shutdown: the drain must not wait for it
        self.lost = 0  # events dropped because its queue was full (written on the loop's thread only)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop, self.done = loop, loop.create_future()
        self._thread.start()

    def offer(self, event: Event) -> bool:
        """Append without blocking; False if the queue is full (the event is lost for it)."""
        with self._cond:
            if len(self._items) >= self.capacity:
                self.lost += 1
                return False
            self._items.append(event)
            self._cond.notify()
            return True

    def drain(self) -> None:
        with self._cond:
            self._phase = "draining" if self._phase == "open" else self._phase
            self._cond.notify()

    def abandon(self) -> int:
        """Drop what is queued; how many events will never be delivered in full (the queued
        ones, and the one `on_event` is still busy with, if any)."""
        with self._cond:
            self._phase = "abandoned"
            count = len(self._items) + self._delivering
            self._items.clear()
            self._cond.notify()
            return count

    def join(self, timeout: float = 1.0) -> bool:
        """Wait at most `timeout` s for its thread to end (the default: one that has signalled
        `done`, which has nothing left to do); whether it has."""
        if self._thread.ident is not None:  # (one that could not start never ran)
            self._thread.join(timeout=timeout)
        return not self._thread.is_alive()

    def undelivered(self) -> int:
        """The events still queued, and the one `on_event` is busy with, if any."""
        with self._cond:
            return len(self._items) + self._delivering

    def _next(self) -> Event | None:
        with self._cond:
            while not self._items and self._phase == "open":
                self._cond.wait()
            self._delivering = bool(self._items)
            return self._items.popleft() if self._items else None

    def _run(self) -> None:
        try:
            while (event := self._next()) is not None:
                self._deliver(event)
                self._delivering = False
            self._close_subscriber()
        finally:
            self._signal_done()

    def _deliver(self, event: Event) -> None:
        """Hand `event` to the subscriber. Whatever it raises is its panic, `BaseException`
        included (`sys.exit()` raises `SystemExit`): this thread is the bus's, so nothing a
        subscriber raises may end it, and the next event is delivered as usual."""
        try:
            self.subscriber.on_event(event)
        except BaseException as exc:
            detail = _described(exc)
            if event.kind in _TROUBLE_KINDS:  # reported as an event, two such subscribers would report each other without end
                _log.warning("subscriber %r raised on a report of subscriber trouble (seq %d): %s",
                             self.name, event.seq, detail)
            else:
                self._on_panic(self, detail)

    def _close_subscriber(self) -> None:
        close = getattr(self.subscriber, "close", None)
        if callable(close):
            try:
                close()
            except BaseException:  # as in `_deliver`: the thread still signals its end
                _log.exception("subscriber %r raised in close()", self.name)

    def _signal_done(self) -> None:
        if self._loop is not None and self.done is not None:
            _call_soon(self._loop, _resolve, self.done)

    def owns_current_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def __repr__(self) -> str:
        return f"<_Mailbox {self.name!r} {self._phase} queued={len(self._items)}/{self.capacity}>"


def _described(exc: BaseException) -> str:
    """`Type: message` of what a subscriber raised, or `<Type: str() raised Other>` when its
    `str()` raises too (that must not end the subscriber's thread)."""
    name = type(exc).__name__
    try:
        message = str(exc)
    except BaseException as problem:  # whatever it is, the thread goes on
        return f"<{name}: str() raised {type(problem).__name__}>"
    return f"{name}: {message}" if message else name


_TroubleKey = tuple[_Mailbox, EventKind]  # whose trouble, and which kind


class Bus:
    """Publishes events to subscribers and iterators; keeps the `is_alive` view."""

    def __init__(
        self,
        subscribers: Iterable[Subscriber] = (),
        bus_capacity: int = DEFAULT_QUEUE_CAPACITY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._capacity = _validate.positive_int("bus_capacity", bus_capacity) or 1
        self._clock = clock
        self._mailboxes = [_Mailbox(s, self._panicked) for s in subscribers]
        self._streams: weakref.WeakSet[EventStream] = weakref.WeakSet()
        self._seq = 0  # the last seq this bus assigned
        self._alive: dict[str, int | None] = {}  # task name -> the attempt that runs
        self._throttles: dict[_TroubleKey, _Throttle] = {}
        self._timers: dict[_TroubleKey, asyncio.TimerHandle] = {}  # one per pending report
        self._loop: asyncio.AbstractEventLoop | None = None  # bound by the first publish
        self._phase: Literal["open", "closing", "closed"] = "open"
        self._closing: asyncio.Future[None] | None = None

    @property
    def last_seq(self) -> int:
        """The `seq` of the last event this bus published (0 before its first)."""
        return self._seq

    # -- publishing (on the loop) -------------------------------------------------------------

    def publish(self, kind: EventKind, **fields: Any) -> Event | None:
        """Stamp, record and fan out one event without blocking; return it.

        An event nobody can observe (no subscriber, no live `events()` iterator, and not a kind
        the alive view reads) is not built: it only takes its `seq`, and None is returned. A busy
        slot's two events per rejected submission are most of the controller's intake cost.
        """
        return self._publish(kind, None, fields)

    def _publish(self, kind: EventKind, skip: _Mailbox | None, fields: dict[str, Any]) -> Event | None:
        loop = self._loop if self._loop is not None else self._bind()  # bound: stay on that loop
        self._seq = seq = next(_SEQ)
        open_ = self._phase == "open"
        tracked = kind in _ALIVE_KINDS
        if not tracked and not (open_ and (self._mailboxes or self._streams.data)):  # type: ignore[attr-defined]
            return None
        event = Event(seq, self._clock(), kind, **fields)
        if tracked:
            self._track(event)
        if open_:
            for box in self._mailboxes:
                if box is not skip and not box.offer(event):
                    self._note(box, EventKind.SUBSCRIBER_OVERFLOW, "", loop)
            if self._streams.data:  # type: ignore[attr-defined]  # live iterators; WeakSet's len() is slow
                for stream in list(self._streams):
                    stream._offer(event)
        return event

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            if self._phase == "open":
                for box in list(self._mailboxes):
                    try:
                        box.start(loop)
                    except RuntimeError as exc:  # no thread for it (a limit on processes): it hears nothing
                        if not _platform.thread_refused(exc):
                            raise
                        self._mailboxes.remove(box)
                        _log.warning("subscriber %r receives no events: its thread cannot start: %s", box.name,
                                     _platform.start_error(exc))
        elif loop is not self._loop:
            raise RuntimeError("this Bus is bound to another event loop")
        return loop

    def _track(self, event: Event) -> None:
        """Keep the `is_alive` view (for the kinds in `_ALIVE_KINDS`)."""
        name = event.task
        if name is None:
            return
        if event.kind is EventKind.ATTEMPT_STARTING:
            self._alive[name] = event.attempt
        elif event.kind is EventKind.TASK_FINISHED:  # a safety net: its attempts are over
            self._alive.pop(name, None)
        elif event.kind in ATTEMPT_TERMINAL_KINDS and name in self._alive:
            running = self._alive[name]
            if event.attempt is None or running is None or running == event.attempt:
                del self._alive[name]

    # -- subscriber trouble --------------------------------------------------------------------

    def _panicked(self, box: _Mailbox, detail: str) -> None:
        """Called on `box`'s thread: hop to the loop to count the panic."""
        loop = self._loop
        if loop is None:
            return
        _call_soon(loop, self._note, box, EventKind.SUBSCRIBER_PANICKED, detail, loop)

    def _note(
        self, box: _Mailbox, kind: EventKind, detail: str, loop: asyncio.AbstractEventLoop
    ) -> None:
        if self._phase != "open":
            return
        key = (box, kind)
        throttle = self._throttles.setdefault(key, _Throttle(TROUBLE_INTERVAL))
        wait = throttle.note(1, detail, loop.time())
        if wait is not None:
            self._timers[key] = loop.call_later(wait, self._report, box, kind, loop)

    def _report(self, box: _Mailbox, kind: EventKind, loop: asyncio.AbstractEventLoop) -> None:
        key = (box, kind)
        del self._timers[key]
        count, detail = self._throttles[key].take(loop.time())
        if kind is EventKind.SUBSCRIBER_PANICKED:
            reason = (
                f"{box.name}: on_event raised on {count} event(s) since the previous report; "
                f"last error: {detail}"
            )
        else:
            reason = (
                f"{box.name}: queue full (queue_capacity={box.capacity}); "
                f"{count} event(s) lost since the previous report"
            )
        self._publish(kind, box, {"reason": reason})
        if not any(other is not box for other in self._mailboxes) and not self._streams.data:  # type: ignore[attr-defined]
            _log.warning("%s (no other subscriber hears of it)", reason)  # never silent

    # -- reading -------------------------------------------------------------------------------

    def events(self) -> EventStream:
        """An iterator of the events published from now on; it ends after `close`."""
        stream = EventStream(self._capacity)
        if self._phase == "open":
            self._streams.add(stream)
        else:
            stream._end()
        return stream

    def alive(self, name: str) -> bool:
        """True while an attempt of the task `name` runs (by the published events)."""
        return name in self._alive

    def alive_snapshot(self) -> list[str]:
        """The names of the tasks with a running attempt, sorted."""
        return sorted(self._alive)

    # -- closing -------------------------------------------------------------------------------

    def waits_for_close(self) -> None:
        """Called on the thread about to wait for the shutdown to end (any thread). If it is a
        subscriber's own (its `on_event` shuts the supervisor down), the drain does not wait for
        that subscriber: it cannot drain while it waits for the drain, and would hold the
        shutdown for the whole `subscriber_shutdown_timeout` before losing its events. Once the
        shutdown returns to it, its thread delivers what is queued and calls its `close()`."""
        for box in self._mailboxes:
            if box.owns_current_thread():
                box.waits_for_close = True
                if self._loop is not None and box.done is not None:
                    _call_soon(self._loop, _resolve, box.done)  # a drain under way stops waiting for it
                return

    def finish_late_drains(self, timeout: float) -> None:
        """Called on a thread that closed a blocking handle, once its loop is over: wait at most
        `timeout` s in total for each subscriber that shut the supervisor down from its `on_event`
        (`waits_for_close`) to deliver the rest of its events and call its `close()` on its own
        thread, which the program's end would cut short (a daemon thread). Not on a subscriber's
        own thread: two such subscribers would wait for each other."""
        if self.on_a_subscribers_thread():
            return
        deadline = time.monotonic() + timeout
        for box in self._mailboxes:
            if box.waits_for_close and not box.join(max(0.0, deadline - time.monotonic())):
                _log.warning("subscriber %r: %d events not delivered and its close() not returned when "
                             "subscriber_shutdown_timeout (%g s) ended; it goes on on its own thread, which the end "
                             "of the program cuts short", box.name, box.undelivered(), timeout)

    def on_a_subscribers_thread(self) -> bool:
        """Whether the calling thread is one of this bus's subscribers' own."""
        return any(box.owns_current_thread() for box in self._mailboxes)

    async def close(self, timeout: float) -> None:
        """Stop intake, end iterators, drain subscribers for at most `timeout` s in total."""
        limit = _validate.duration("subscriber_shutdown_timeout", timeout) or 0.0
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._drain(limit))
        await asyncio.shield(self._closing)

    async def _drain(self, timeout: float) -> None:
        self._phase = "closing"
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for stream in list(self._streams):
            stream._end()
        self._streams.clear()
        for box in self._mailboxes:
            box.drain()
        waiting = [box.done for box in self._mailboxes if box.done is not None]
        if waiting:
            await asyncio.wait(waiting, timeout=timeout)
        for box in self._mailboxes:
            undelivered = 0
            if box.waits_for_close:
                pass  # it goes on once the shutdown returns to it, on its own thread
            elif box.done is not None and not box.done.done():
                undelivered = self._abandon(box, timeout)  # still blocked in its callback at the deadline: left behind
            elif box.done is not None:
                box.join()  # it signalled its end as its last step: no subscriber thread outlives close
            self._tell_abandoned(box, box.lost + undelivered)
        self._phase = "closed"

    def _abandon(self, box: _Mailbox, timeout: float) -> int:
        """Leave `box` behind, and say so (a WARNING on `mpvisor.bus`); how many of its events
        were never delivered."""
        count = box.abandon()
        if not count:  # busy in `close()`: every event was delivered, but what close() does may not end
            _log.warning("subscriber %r: its close() had not returned when subscriber_shutdown_timeout (%g s) "
                         "ended; it goes on on its own thread, which the end of the program cuts short",
                         box.name, timeout)
            return 0
        _log.warning("subscriber %r: %d events not delivered: it was still busy when "
                     "subscriber_shutdown_timeout (%g s) ended", box.name, count, timeout)
        return count

    @staticmethod
    def _tell_abandoned(box: _Mailbox, count: int) -> None:
        """The subscriber's `abandoned(count)`, if it has one and lost any event: those its full
        queue dropped during the run and those left undelivered at the deadline. Called here, on
        the loop's thread: its own may still be busy."""
        hook = getattr(box.subscriber, "abandoned", None)
        if count and callable(hook):
            try:
                hook(count)
            except Exception:
                _log.exception("subscriber %r raised in abandoned()", box.name)

    def __repr__(self) -> str:
        return (
            f"<Bus {self._phase} seq={self._seq} subscribers={len(self._mailboxes)} "
            f"streams={len(self._streams)} alive={len(self._alive)}>"
        )
