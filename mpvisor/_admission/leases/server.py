"""Who decides, for every mpvisor process of one user on this host, which one owns a slot?

The slot server: `mpvisor slots serve` (`_cli/serve.py`; started on demand by the first client, or by hand under
a service manager). It is a thin I/O shell around the controller's own pure `SlotTable`
(`../slots.py`): a lease request is a table item; `Admit` is a grant, `Reject` a rejection,
`RemoveOwner` a `revoke` sent to the owner's process, and the owner's `release` (or, if its
connection closed, the exit of every process it registered) is `owner_cleaned_up`. The lease
protocol and the client are `local.py`.

| what happens | the server |
|---|---|
| a client connects | checks its uid (`SO_PEERCRED`): another user's is refused with an error, then closed |
| `submit` | applies it to the table; replies granted / queued (position, owner) / rejected |
| `release` | the owner's tree is gone: cleanup, the next in line is granted |
| the owner's connection closes without `release` | waits for every registered process of the owner (pidfds), then cleanup |
| a queued client's connection closes, or `withdraw` | its request leaves the queue (a `withdraw` that crossed its `granted` on the way releases the slot: the client never learned it owned it) |
| a malformed frame | `error`, then that client is disconnected (the stream cannot be resynchronised) |
| an unknown or malformed request in a good frame | `error`; the client stays connected |
| nothing held, queued or connected for `idle_exit` s | exits (removing its socket; at SIGINT/SIGTERM with clients connected, it leaves it: they reconnect) |
| it starts and finds a stale socket (a server died, or stopped, with clients) | holds back every `submit` for `RECOVERY` s, taking reclaims only (below) |
| its socket's name is removed or replaced | binds it again (looked at every `CHECK_EVERY` s), said once in its log; its directory and `server.lock` removed too: made and locked anew first, the leases saved |

Only one server runs per directory: it holds `server.lock` (`flock`) for its life, and only the
holder may remove a stale socket and bind. It writes its leases to `leases.json` whenever an owner
or an owner's processes change (a queued request is not in it); a new server inherits the
leases whose processes still run (module docstring of `local.py`). A write that fails (a full
disk) leaves the last file as it was and no half-written one, and is said once on stderr; the
table in memory goes on, and a new server learns of the owners when they reclaim their leases.
So that an owner the file does not name (unwritten, or removed) is not granted away before it
reclaims, a server that finds the stale socket of one that died first waits `RECOVERY` s,
answering reclaims only: owners reconnect at once (their watcher reads the EOF), while a
queued run's submission waits; a `withdraw` or a disconnect takes a held-back one away.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import field
from typing import Any

from mpvisor import _platform
from mpvisor._admission.leases import local as _leases
from mpvisor._admission.leases.local import MAX_FRAME, check_request, encode
from mpvisor._admission.leases.store import POLICIES, REJECTION_NAMES, Pid, pid_of
from mpvisor._admission.slots import (
    AdmissionPolicy,
    Admit,
    Reject,
    RemoveOwner,
    SlotTable,
    Terminating,
    Transition,
    owner_of,
    status_of,
)
from mpvisor._model.records import record
from mpvisor._model.wire import FrameDecoder, ProtocolError

IDLE_EXIT = 30.0  # seconds with nothing held, queued or connected before the server exits
MAX_QUEUE = 1000  # pending requests per slot
MAX_CLIENT_BUFFER = 1 << 20  # bytes queued to one client before it is dropped
CLOSE_WAIT = 1.0  # seconds, at exit, for the connections' handlers to clean up
RECOVERY = 1.5  # seconds a server that replaces one that died holds back new submissions (owners reclaim first)
CHECK_EVERY = 1.0  # seconds between two looks at the socket's path (removed or replaced under the server)
_CRED = struct.Struct("3i")


@record(eq=False)
class Request:
    """One lease request: a `SlotTable` item (`id`, `slot`, `admission`)."""

    id: int
    slot: str
    admission: AdmissionPolicy
    name: str
    client: Client | None  # None: inherited from a server that died, not reclaimed yet
    req: int
    pids: dict[Pid, int] = field(default_factory=dict)  # registered processes -> pidfd (or -1)
    since: float = 0.0  # wall clock: when it was granted
    holder_pid: int = 0


class Client:
    """One connection."""

    def __init__(self, server: SlotServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.pid = 0
        self.requests: dict[int, Request] = {}  # by the client's req number

    def send(self, message: dict[str, Any]) -> None:
        if self.writer.is_closing():
            return
        transport = self.writer.transport
        if transport.get_write_buffer_size() > MAX_CLIENT_BUFFER:
            self.writer.close()  # it does not read what it asked for: only it is dropped
            return
        self.writer.write(encode(message))


class SlotServer:
    def __init__(self, directory: str, idle_exit: float = IDLE_EXIT) -> None:
        self.directory = directory
        self.idle_exit = idle_exit
        self.table: SlotTable[Request] = SlotTable(MAX_QUEUE)
        self.by_id: dict[int, Request] = {}  # owners and queued requests
        self.clients: set[Client] = set()
        self.handlers: set[asyncio.Task[Any]] = set()  # one per connection, until it returns
        self.next_id = 1
        self.loop = asyncio.get_running_loop()
        self.done = asyncio.Event()
        self._idle_timer: asyncio.TimerHandle | None = None
        self.uid = os.getuid()
        self._unsaved = False  # a save of the leases failed (said once on stderr, the server's log)
        self._held_back: list[tuple[Client, dict[str, Any]]] | None = None  # submissions while recovering

    # --- start-up --------------------------------------------------------------------------------

    def inherit(self) -> None:
        """Take over the leases of a server that died, as long as their processes run."""
        path = os.path.join(self.directory, _leases.STATE_NAME)
        try:
            with open(path) as f:
                entries = json.load(f)
        except (OSError, ValueError):
            return
        for entry in entries if isinstance(entries, list) else []:
            try:
                slot, name, since = str(entry["slot"]), str(entry["name"]), float(entry["since"])
                pids = [Pid(int(p[0]), int(p[1])) for p in entry["pids"]]
            except (KeyError, TypeError, ValueError, IndexError):
                continue
            request = self._new_request(slot, AdmissionPolicy.QUEUE, name, None, 0)
            request.since = since
            request.holder_pid = pids[0].pid if pids else 0
            self._grant_inherited(request, pids)

    def recover(self, seconds: float) -> None:
        """This server replaces one that died with clients connected: for `seconds`, hold back
        every `submit` (answer nothing) and take only reclaims, so that an owner the state file
        does not name (it could not be written, or was removed) has its lease back before a run
        queued under the dead server, which submits again, can be granted the slot it holds."""
        self._held_back = []
        self.loop.call_later(seconds, self._recovered)

    def _recovered(self) -> None:
        held, self._held_back = self._held_back or [], None
        for client, message in held:
            if client in self.clients:
                self._submit(client, message)

    def _grant_inherited(self, request: Request, pids: list[Pid]) -> None:
        effects = self.table.submit(request, time.monotonic())
        if not any(isinstance(e, Admit) for e in effects):
            return  # the same slot twice in the state: the first one holds it
        self.table.registry_accepted(request.slot, request.id, time.monotonic())
        self.by_id[request.id] = request
        self._watch(request, pids)
        if not request.pids:  # nothing of the owner runs any more
            self._cleanup(request)

    # --- connections -------------------------------------------------------------------------------

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        try:
            await self._serve_client(reader, writer)
        finally:
            self.handlers.discard(task)

    async def close_connections(self, timeout: float) -> None:
        """At exit: drop every connection (what is still unsent goes too), and let each handler
        see its end and clean up as for a client that went away. (Leaving them to be cancelled
        instead makes Python 3.11's streams print a traceback for each.)"""
        for client in list(self.clients):
            client.writer.transport.abort()
        if self.handlers:
            await asyncio.wait(set(self.handlers), timeout=timeout)

    async def _serve_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = Client(self, reader, writer)
        sock = writer.get_extra_info("socket")
        try:
            _, uid, _ = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
        except OSError:
            uid = -1
        if uid != self.uid:
            client.send({"t": "error", "message": f"refused: this slot server serves uid {self.uid} only, not uid {uid}"})
            await _close(writer)
            return
        self.clients.add(client)
        self._cancel_idle()
        decoder = FrameDecoder(MAX_FRAME)
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                try:
                    messages = decoder.feed(data)
                except ProtocolError as exc:
                    client.send({"t": "error", "message": f"malformed frame: {exc}; disconnecting"})
                    break
                for message in messages:
                    try:
                        self._on_request(client, check_request(message))
                    except ProtocolError as exc:
                        client.send({"t": "error", "message": str(exc)})
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self.clients.discard(client)
            self._on_disconnect(client)
            await _close(writer)
            self.maybe_idle()

    def _on_request(self, client: Client, message: dict[str, Any]) -> None:
        match message["t"]:
            case "hello":
                if message["v"] != _leases.VERSION:
                    client.send({"t": "error", "message": f"lease protocol version {message['v']}, this server speaks {_leases.VERSION}"})
                    client.writer.close()
                    return
                client.pid = message["pid"]
            case "submit":
                if self._held_back is not None:
                    self._held_back.append((client, message))
                    return
                self._submit(client, message)
            case "pids":
                request = client.requests.get(message["req"])
                if request is not None:
                    self._watch(request, [Pid(*p) for p in message["pids"]])
            case "release":
                request = client.requests.get(message["req"])
                if request is not None and self._owns(request):
                    self._cleanup(request)
            case "withdraw":
                if self._held_back is not None:  # a submission held back leaves without a word
                    self._held_back = [(c, m) for c, m in self._held_back
                                       if c is not client or m["req"] != message["req"]]
                request = client.requests.pop(message["req"], None)
                if request is not None and self.table.purge(request.id) is not None:
                    self._forget(request)  # queued: not in the state file
                elif request is not None and self._owns(request):
                    # Granted while the withdraw was on its way: the client gave up without
                    # learning it owned the slot, so nothing ran under it. Left alone, this
                    # lease would belong to no request of the client and never be freed.
                    self._cleanup(request)
            case "reclaim":
                self._reclaim(client, message)
            case "snapshot":
                client.send({"t": "snapshot", "slots": self.snapshot()})

    def _submit(self, client: Client, message: dict[str, Any]) -> None:
        if message["req"] in client.requests:
            client.send({"t": "error", "message": f"request {message['req']} is already in use on this connection"})
            return
        request = self._new_request(message["slot"], POLICIES[message["policy"]], message["name"], client, message["req"])
        request.holder_pid = client.pid
        client.requests[request.req] = request
        self.by_id[request.id] = request
        self._watch(request, [Pid(*p) for p in message["pids"]])
        self._apply(self.table.submit(request, time.monotonic()))
        if request.id in self.by_id and request.since == 0.0:
            queue = self.table.pending(request.slot)
            if request in queue:
                owner = self._owner_view(request.slot)
                if owner is not None:  # its launcher's processes too: a waiter in one of their trees waits for itself
                    owner["launcher"] = self._launcher_pids(request.slot)
                client.send({"t": "queued", "req": request.req, "position": queue.index(request) + 1, "owner": owner})

    def _reclaim(self, client: Client, message: dict[str, Any]) -> None:
        """A client whose server died says it holds `slot`: an inherited lease is its again; a
        slot nobody holds is granted to it before anyone else (it never stopped running)."""
        owner = owner_of(self.table.phase(message["slot"]))
        held = self.by_id.get(owner) if owner is not None else None
        pids = [Pid(*p) for p in message["pids"]]
        if held is not None and held.client is None and held.name == message["name"]:
            held.client, held.req = client, message["req"]
            client.requests[held.req] = held
            self._watch(held, pids)
            if isinstance(self.table.phase(held.slot), Terminating):  # a replacement waits for it
                client.send({"t": "revoke", "req": held.req})
            return
        if held is None:
            request = self._new_request(message["slot"], AdmissionPolicy.QUEUE, message["name"], client, message["req"])
            request.holder_pid = client.pid
            client.requests[request.req] = request
            request.since = float(message["since"])
            self._grant_inherited(request, pids)  # saves the state file: its processes, or its end
            return
        client.send({"t": "error", "message": f"cannot reclaim slot {message['slot']!r}: another owner holds it"})

    def _on_disconnect(self, client: Client) -> None:
        for request in list(client.requests.values()):
            if self.table.purge(request.id) is not None:  # queued: it leaves the queue
                self._forget(request)
                continue
            request.client = None  # an owner: held until its processes are gone
            if request.id in self.by_id and not request.pids:
                self._cleanup(request)
        client.requests.clear()  # the state file names no connection: what changed in it is saved above

    # --- the table's effects -----------------------------------------------------------------------

    def _apply(self, effects: list[Any]) -> bool:
        """Carry out the table's effects; whether a grant saved the state file."""
        saved = False
        for effect in effects:
            match effect:
                case Admit(item):
                    item.since = time.time()
                    self.table.registry_accepted(item.slot, item.id, time.monotonic())
                    if item.client is not None:
                        item.client.send({"t": "granted", "req": item.req})
                    self._save()
                    saved = True
                case Reject(item, kind):
                    self._forget(item)
                    if item.client is not None:
                        item.client.requests.pop(item.req, None)
                        item.client.send({"t": "rejected", "req": item.req, "kind": REJECTION_NAMES.get(kind, kind.value)})
                case RemoveOwner(_, owner_id):
                    owner = self.by_id.get(owner_id)
                    if owner is not None and owner.client is not None:
                        owner.client.send({"t": "revoke", "req": owner.req})
                case Transition():
                    pass
        self.maybe_idle()
        return saved

    def _cleanup(self, request: Request) -> None:
        """The owner's tree is gone: the slot goes to the next in line."""
        self._forget(request)
        if request.client is not None:
            request.client.requests.pop(request.req, None)
        if not self._apply(self.table.owner_cleaned_up(request.slot, request.id, time.monotonic())):
            self._save()  # the slot went idle (a grant to the next in line saved it already)

    def _forget(self, request: Request) -> None:
        self.by_id.pop(request.id, None)
        for fd in request.pids.values():
            if fd >= 0:
                self.loop.remove_reader(fd)
                os.close(fd)
        request.pids.clear()

    # --- the owner's processes -------------------------------------------------------------------------

    def _watch(self, request: Request, pids: list[Pid]) -> None:
        """Hold a pidfd on each process (checked against its start time); an owner whose
        connection is gone is cleaned up when the last one exits. The state file changes only
        when an owner's processes do (a queued request is not in it: it is saved once granted)."""
        known = len(request.pids)
        for pid in pids:
            if pid in request.pids:
                continue
            try:
                fd = _platform.pidfd_open(pid.pid)
            except OSError:
                continue  # already gone
            if pid_of(pid.pid) != pid:
                os.close(fd)  # the pid names another process now: the one registered is gone
                continue
            request.pids[pid] = fd
            self.loop.add_reader(fd, self._on_exit, request, pid)
        if len(request.pids) != known and self._owns(request):
            self._save()

    def _on_exit(self, request: Request, pid: Pid) -> None:
        fd = request.pids.pop(pid, -1)
        if fd >= 0:
            self.loop.remove_reader(fd)
            os.close(fd)
        if request.client is None and not request.pids and request.id in self.by_id:
            self._cleanup(request)
        elif self._owns(request):
            self._save()

    def _owns(self, request: Request) -> bool:
        """Whether `request` holds its slot's lease (what the state file lists)."""
        return owner_of(self.table.phase(request.slot)) == request.id

    # --- views, state, idling ------------------------------------------------------------------------

    def snapshot(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        views = []
        for view in self.table.snapshot(now):
            owner = self._owner_view(view.slot)
            # `paused`: a stopped holder (SIGSTOP, Ctrl-Z, a debugger) holds its slot, or is granted it, until resumed
            queue = [{"pid": r.holder_pid, "name": r.name, "paused": _platform.is_stopped(r.holder_pid)}
                     for r in self.table.pending(view.slot)]
            views.append({"slot": view.slot, "status": view.status.label, "owner": owner, "queue": queue})
        return views

    def _launcher_pids(self, slot: str) -> list[int]:
        """The processes the owner of `slot` registered besides its holder's own: its launcher's,
        whose trees are its tasks' attempts (`LeaseDriver`'s `held_by_an_ancestor` reads them)."""
        owner = owner_of(self.table.phase(slot))
        request = self.by_id.get(owner) if owner is not None else None
        if request is None:
            return []
        return [pid.pid for pid in request.pids if pid.pid != request.holder_pid]

    def _owner_view(self, slot: str) -> dict[str, Any] | None:
        owner = owner_of(self.table.phase(slot))
        request = self.by_id.get(owner) if owner is not None else None
        if request is None:
            return None
        return {"pid": request.holder_pid, "name": request.name, "since": request.since,
                "status": status_of(self.table.phase(slot)).label, "paused": _platform.is_stopped(request.holder_pid)}

    def save(self) -> None:
        """`_save`, for `serve`: the state file again, once the directory was made anew."""
        self._save()

    def _save(self) -> None:
        """Write the leases held now (atomically: a new file renamed over the old)."""
        leases = []
        for slot in [v.slot for v in self.table.snapshot(time.monotonic())]:
            owner = owner_of(self.table.phase(slot))
            request = self.by_id.get(owner) if owner is not None else None
            if request is not None:
                leases.append({"slot": slot, "name": request.name, "since": request.since,
                               "pids": [list(p) for p in request.pids]})
        path = os.path.join(self.directory, _leases.STATE_NAME)
        fresh = f"{path}.{os.getpid()}"
        try:
            with open(os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                json.dump(leases, f)
            os.replace(fresh, path)
        except OSError as exc:  # a full disk: the leases live on here; the owners reclaim them from a new server
            with contextlib.suppress(OSError):
                os.unlink(fresh)
            if not self._unsaved:
                self._unsaved = True
                with contextlib.suppress(OSError, ValueError):
                    print(f"mpvisor slots serve: cannot save the leases in {path!r}: {exc.strerror or exc} "
                          f"(said once)", file=sys.stderr, flush=True)

    def _new_request(self, slot: str, admission: AdmissionPolicy, name: str, client: Client | None, req: int) -> Request:
        request = Request(self.next_id, slot, admission, name, client, req)
        self.next_id += 1
        return request

    def maybe_idle(self) -> None:
        if self.clients or self.by_id or self._idle_timer is not None:
            return
        self._idle_timer = self.loop.call_later(self.idle_exit, self._idle_exit)

    def _cancel_idle(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _idle_exit(self) -> None:
        self._idle_timer = None
        if not self.clients and not self.by_id:
            self.done.set()


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await writer.wait_closed()
    except (ConnectionError, OSError):
        pass


async def serve(directory: str, idle_exit: float = IDLE_EXIT, *, on_demand: bool = False,
                listening: Callable[[], None] | None = None) -> int:
    """Run the server for `directory` until idle; 3 if another server holds it (said on stderr,
    unless `on_demand`: a client started this one, and another client's won the race to serve).
    `listening` is called once it answers connections (`mpvisor slots serve --detach`)."""
    lock = os.open(os.path.join(directory, _leases.LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        if not on_demand:
            print(f"mpvisor slots serve: another slot server already serves {directory!r}", file=sys.stderr)
        os.close(lock)
        return _leases.ANOTHER_SERVES
    path = _leases.socket_path(directory)
    server = SlotServer(directory, idle_exit)
    server.inherit()
    if os.path.lexists(path):  # a server died (or stopped) with clients: its owners reclaim before anyone is granted
        server.recover(RECOVERY)
    listener = await _listen(server, path)
    if listener is None:
        os.close(lock)
        return 1
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, server.done.set)
    server.maybe_idle()
    if listening is not None:
        listening()
    held = [lock]  # the lock's fd: `_keep_socket` takes a new one if the directory is made anew
    watching = asyncio.ensure_future(_keep_socket(server, path, listener, held))
    connected = False
    try:
        await server.done.wait()
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            listener = await watching
        listener.close()
        connected = bool(server.clients)
        await server.close_connections(CLOSE_WAIT)
        if not connected:  # left behind otherwise: the next server sees that clients may be reconnecting
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        os.close(held[0])  # the lock goes last: no other server binds before our socket is gone
    return 0


async def _listen(server: SlotServer, path: str, *, quiet: bool = False) -> asyncio.Server | None:
    """Bind the socket at `path` (0600), removing a stale one: the caller holds the lock, so no
    other server answers there. None, said on stderr (unless `quiet`), when it cannot."""
    old_umask = os.umask(0o177)  # the socket is created 0600
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        listener = await asyncio.start_unix_server(server.handle, path=path)
    except OSError as exc:  # something else in the socket's place (a directory), a path too long...
        if not quiet:
            print(f"mpvisor slots serve: cannot serve at {path!r}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return None
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    return listener


def _relock(directory: str, held: list[int]) -> bool:
    """Whether `held[0]` still locks the directory's `server.lock`: if that file was removed (the
    whole directory, say), make the directory again and lock a new one (the leases saved anew),
    so that a run started now finds this server, not the lock free for a second one."""
    path = os.path.join(directory, _leases.LOCK_NAME)
    with contextlib.suppress(OSError):
        there, ours = os.stat(path), os.fstat(held[0])
        if (there.st_dev, there.st_ino) == (ours.st_dev, ours.st_ino):
            return True
    if _platform.private_dir(directory, "the slot server's directory") is not None:
        return False
    try:
        lock = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock)  # another server took the new directory first: it serves new runs
        return False
    os.close(held[0])
    held[0] = lock
    return True


async def _keep_socket(server: SlotServer, path: str, listener: asyncio.Server, held: list[int]) -> asyncio.Server:
    """Every `CHECK_EVERY` s, check that `path` is still the socket this server listens at; if it
    was removed or replaced (a clean-up of the directory, a hand), bind it again, after locking
    `server.lock` anew if it went too (`_relock`). Without this, every run from then on starts a
    server that finds this one holding the lock, and fails (or, the lock gone too, serves: two
    owners of one slot), while this one goes on serving only the connections it has. Returns the
    listener in use."""
    bound, failed = _platform.socket_inode(path), False
    try:
        while True:
            await asyncio.sleep(CHECK_EVERY)  # a poll: nothing notifies a removal of a socket's name
            now = _platform.socket_inode(path)
            if now is not None and now == bound:
                continue
            if not _relock(server.directory, held):
                if not failed:
                    print(f"mpvisor slots serve: {server.directory!r} was removed and is served by another "
                          f"server now, or cannot be made again", file=sys.stderr, flush=True)
                failed = True
                continue
            server.save()
            fresh = await _listen(server, path, quiet=failed)
            failed = fresh is None
            if fresh is None:
                continue  # said on stderr (once); tried again at the next look
            listener.close()
            listener, bound = fresh, _platform.socket_inode(path)
            print(f"mpvisor slots serve: the socket {path!r} was removed or replaced; serving it again",
                  file=sys.stderr, flush=True)
    except asyncio.CancelledError:
        return listener
