"""Who else hears about every attempt, reliably? (the seam a service run plugs into)

Events are best-effort: a consumer may lose them, so nothing decides on them. A layer that must
decide on what attempts do (a service run: start a dependent once its dependency is ready,
write every output line to a log file, stop an attempt whose health check fails) installs one
`AttemptHooks` on the runtime (`Runtime.hooks`); the runtime calls it on its loop, in order,
for every attempt of every task, and lets it act back through `Runtime.mark_ready` and
`Runtime.fail_attempt`.

| the runtime calls | when | the hook may |
|---|---|---|
| `environment(id, name, attempt)` | an attempt's start message is built | add variables to its environment (`NOTIFY_SOCKET`), note what its checks compare with (before its process is made: what a `file` check's path holds); raise `OSError` when what the attempt needs cannot be made: it fails to start, `could not start: ` and the error |
| `captures(name)` | likewise | say its stdout and stderr lines come to `output` (not the parent's streams) |
| `started(id, name, attempt, pid)` | it leads its session (after `ATTEMPT_STARTING`) | start probing it |
| `ready(id, name, attempt, how)` | `mark_ready` was called for it (its `ready()`, a `READY=1`, a probe) | say whether that makes it ready (its readiness check decides; `ATTEMPT_READY` is published only then), and start what comes after it |
| `output(id, name, stream, line)` | a line it wrote (when `captures`) | write it somewhere |
| `ended(id, name, attempt, end)` | its tree is gone (after its terminal event) | stop probing it |
| `stopping(id, name)` | shutdown begins to stop its task (its group of `stop_order`, or all at once) | say it is stopping |
"""

from __future__ import annotations

from typing import Protocol

from mpvisor._tasks.ending import AttemptEnd


class AttemptHooks(Protocol):
    def environment(self, id: int, name: str, attempt: int) -> dict[str, str] | None: ...
    def captures(self, name: str) -> bool: ...
    def started(self, id: int, name: str, attempt: int, pid: int) -> None: ...
    def ready(self, id: int, name: str, attempt: int, how: str) -> bool: ...  # False: `how` does not make it ready
    def output(self, id: int, name: str, stream: str, line: str) -> None: ...
    def ended(self, id: int, name: str, attempt: int, end: AttemptEnd) -> None: ...
    def stopping(self, id: int, name: str) -> None: ...
