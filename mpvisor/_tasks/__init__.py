"""What happens to one task, attempt after attempt, and which tasks exist?

Owns the parent's side of a task: `attempt` (`AttemptProcess`, one attempt's facts and timers,
the `AttemptSink` of a launcher), `ending` (what an attempt's end means, pure), `actor` (one
task's loop: permit, attempt, decide, wait), `registry` (membership, claims, terminal cleanup,
waiters), `intake` (the bounded, ordered command queues) and `oneshot` (a value many tasks
await, each canceled alone, without `asyncio.shield`'s extra loop turn).

May import: `_model`, `_attempt`, `_launchers`, `_platform`.
"""
