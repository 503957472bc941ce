"""How does `mpvisor run --slot NAME` share its slot with every other mpvisor process of the user?

It takes the slot's lease from the slot server (`_leases.py`, `_slotserver.py`) once its
launcher is ready and before its task is added, holds it while the task runs in this process's
own tree, and gives it back at the task's removal (`TASK_REMOVED`: its last tree is reaped), or,
at the latest, once the supervisor has shut down. Also `mpvisor slots` (the table) and
`mpvisor slots serve`.

| what happens | `mpvisor run --slot` |
|---|---|
| the slot is free | runs at once |
| busy, `--policy queue` (default) | says on stderr that it waits (position, the owner), then runs |
| busy, `--policy drop` | exits `SLOT_BUSY` (3), nothing ran |
| queue full | exits `QUEUE_FULL` (4) |
| replaced in the queue by a `--policy replace` | exits `SUPERSEDED` (5), nothing ran |
| a `--policy replace` arrives while it runs | its task is stopped as on Ctrl-C (grace, then a tree kill); exits `REPLACED` (6) |
| Ctrl-C / SIGTERM while queued | leaves the queue, then dies by the signal |
| Ctrl-C / SIGTERM while it runs | as without `--slot`; the lease is released once the tree is gone |
| it is SIGKILLed | the server releases the lease once this process, its launcher and its attempts are gone |
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from mpvisor._admission.leases.local import (
    Decision,
    LeaseClient,
    LeaseError,
    NoServer,
    owner_pids,
    pid_of,
    queued_text,
    silent_text,
)
from mpvisor._cli.options import UsageParser, seconds
from mpvisor._model.errors import ConfigError, ShuttingDown
from mpvisor._model.events import Event, EventKind

if TYPE_CHECKING:
    from mpvisor._runtime.runtime import Runtime

SLOT_BUSY = 3
QUEUE_FULL = 4
SUPERSEDED = 5
REPLACED = 6
REJECTED_STATUS = {"slot_busy": SLOT_BUSY, "queue_full": QUEUE_FULL, "superseded_by_replace": SUPERSEDED}
REJECTED_REASON = {
    "slot_busy": "the slot is busy (--policy drop)",
    "queue_full": "the slot's queue is full",
    "superseded_by_replace": "superseded by a replacement while queued",
}


class SlotLease:
    """This process's lease on one slot, from the request to its release."""

    def __init__(self, slot: str, policy: str, name: str) -> None:
        self.slot, self.policy, self.name = slot, policy, name
        self.client = LeaseClient()
        self.revoked = False
        self._released = False
        self._lock = threading.Lock()

    def _queued(self, position: int, owner: dict[str, Any] | None) -> None:
        print(f"mpvisor: {queued_text(self.slot, position, owner)}", file=sys.stderr, flush=True)

    def _silent(self) -> None:
        print(f"mpvisor: {silent_text(self.slot)}", file=sys.stderr, flush=True)

    def before_add(self) -> Callable[[Runtime], Awaitable[None]]:
        """What `Supervisor.run` does before it adds the task: once the launcher is ready (so
        that a grant costs only a fork), ask for the lease with this process, the launcher and
        its guardian as the owner's processes (the launcher exits only after every tree it
        forked is gone); wait in the queue (a shutdown, Ctrl-C or SIGTERM, leaves it); raise
        `SlotRejected` if refused; then watch for a revoke."""

        async def hook(runtime: Runtime) -> None:
            await runtime.ready()
            pids = owner_pids(runtime.client)
            loop = runtime.loop
            asked: asyncio.Future[Decision] = loop.run_in_executor(
                None, self.client.acquire, self.slot, self.policy, self.name, pids, self._queued, self._silent)
            stopping: asyncio.Future[Any] = asyncio.ensure_future(runtime._stopping.wait())
            try:
                await asyncio.wait([asked, stopping], return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
            if not asked.done():  # interrupted while queued
                self.client.withdraw()
                self.client.close()
                raise ShuttingDown(f"interrupted while queued for slot {self.slot!r}: left the queue")
            try:
                decision = asked.result()
            except LeaseError as exc:
                self.client.close()
                raise ConfigError(f"slot {self.slot!r}: {exc}") from None
            if not decision.granted:
                self.client.close()
                raise SlotRejected(decision.kind or "slot_busy")

            def revoke() -> None:
                self.revoked = True
                print(f"mpvisor: slot {self.slot!r}: replaced by a newer submission; stopping", file=sys.stderr, flush=True)
                loop.create_task(_shut(runtime))

            def on_revoke() -> None:  # on the lease's thread
                loop.call_soon_threadsafe(revoke)

            self.client.watch(on_revoke)

        return hook

    def release(self) -> None:
        """Give the lease back (once: at the task's removal, its tree reaped, or at the end)."""
        with self._lock:
            if self._released:
                return
            self._released = True
        self.client.release()

    def close(self) -> None:
        self.release()
        self.client.close()


class SlotRejected(Exception):
    """The slot server refused the lease (`kind`: slot_busy, queue_full, superseded_by_replace)."""

    def __init__(self, kind: str) -> None:
        super().__init__(REJECTED_REASON.get(kind, kind))
        self.kind = kind
        self.status = REJECTED_STATUS.get(kind, 1)


class LeaseSubscriber:
    """Registers each attempt's pid with the slot server as it starts, and releases the lease
    as soon as the task is removed (its tree reaped), before the supervisor finishes shutting down."""

    name = "slot-lease"
    queue_capacity = 1024

    def __init__(self, lease: SlotLease) -> None:
        self.lease = lease

    def on_event(self, event: Event) -> None:
        if event.kind is EventKind.ATTEMPT_STARTING and event.pid:
            found = pid_of(event.pid)
            if found is not None:
                self.lease.client.add_pids([found])
        elif event.kind is EventKind.TASK_REMOVED:  # terminal cleanup: its last tree is reaped
            self.lease.release()


async def _shut(runtime: Runtime) -> None:
    try:
        await runtime.shutdown()
    except Exception:
        pass  # `run` reports it: it awaits the same shutdown


# --- `mpvisor slots` -----------------------------------------------------------------------------------

SHOW_WAIT = 5.0  # seconds `mpvisor slots` waits for the slot server's answer (a stopped one never answers)


def slots_main(argv: list[str]) -> int:
    """`mpvisor slots [--json]` and `mpvisor slots serve [...]`."""
    if argv[:1] == ["serve"]:
        from mpvisor._admission.leases import server as _slotserver

        return _slotserver.main(argv[1:])
    parser = UsageParser(prog="mpvisor slots", description="Show this user's shared slots.")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.add_argument("--wait", type=seconds(allow_zero=False), default=SHOW_WAIT, metavar="SECONDS",
                        help=f"how long the slot server may take to answer before this is an error (default {SHOW_WAIT:g})")
    args = parser.parse_args(argv)
    try:
        client = LeaseClient(start=False)
    except NoServer:
        slots: list[dict[str, Any]] = []  # no server: nothing is held or queued
    except LeaseError as exc:
        print(f"mpvisor slots: {exc}", file=sys.stderr)
        return 1
    else:
        try:
            slots = client.snapshot(args.wait)
        except LeaseError as exc:
            print(f"mpvisor slots: {exc}", file=sys.stderr)
            return 1
        finally:
            client.close()
    if args.json:
        print(json.dumps({"slots": slots}))
        return 0
    print(f"{'SLOT':20s} {'STATUS':12s} {'OWNER PID':>9s}  {'OWNER':20s} {'SINCE':8s}  QUEUE")
    for view in slots:
        owner = view.get("owner") or {}
        since = time.strftime("%H:%M:%S", time.localtime(owner["since"])) if owner.get("since") else "-"
        queue = ", ".join(f"{q['name']} ({q['pid']})" for q in view.get("queue", [])) or "-"
        print(f"{view['slot']:20s} {view['status']:12s} {owner.get('pid', '-')!s:>9s}  {owner.get('name', '-')!s:20s} {since:8s}  {queue}")
    return 0

