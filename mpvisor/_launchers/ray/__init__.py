"""How does an attempt run on a Ray cluster, with the guarantees it has on this machine?

Ray places the attempt and carries its bytes; mpvisor keeps the process semantics. Each attempt
gets an **agent**: a Ray actor of its own (`Agent`, created with the attempt's `Resources`,
`max_restarts=0`, `max_task_retries=0`: mpvisor's restart policy alone decides), which runs the
local launcher of this package (`local.LauncherClient`: a guardian and a fork server in the
agent's worker, the attempt forked from it in its own session, a subreaper, every process of its
tree reaped before `exited`). The agent relays the attempt channel's bytes unchanged and its
reports as a list of events that the parent long-polls (`Agent.events`); requests go the other
way as actor calls (`signal`, `kill`), which Ray delivers in order. The agent always captures the
attempt's stdout and stderr, so what it prints comes back in those events, in order and before
its end, never through the Ray worker's own stdout (which Ray would forward, prefixed, and may
lose at exit).

| the agent reports | the parent's `RayClient` tells the attempt's sink |
|---|---|
| `placed node pid` | nothing: it remembers the node (to tell a lost node from a dead agent) |
| `started pid` | `on_started(pid)` |
| `data bytes` | `on_data` |
| `output stream line` (always captured there) | `on_output`, if the runtime captures; else the line is written to this process's fd 1 / fd 2 (`echo.Echo`) |
| `exited how value killed oom memory cpu used` (the tree is reaped) | `on_eof()`, `on_exited(...)` (once its lines are written) |
| `start_failed error [how value memory cpu]` | `on_start_failed(error, ended)` |
| `start_failed error True` (its local launcher cannot start: a `preload` failed) | `on_start_failed(error, fatal=True)` |
| `launcher_died how began` (its fork server died, the tree seen gone) | `on_eof()`, `on_launcher_died(how, began)` |
| (the actor is dead: Ray says so) | after the fence: `on_eof()`, `on_launcher_died("node lost ...")` or `("launcher died ...")` |

**Lost, not exited.** When Ray declares the agent dead (its worker or its node died), nobody saw
the attempt's processes go: the report waits `lost_fence` seconds more, so that the slot's next
owner, or the retry, never overlaps a tree that is still being torn down. Why that is enough: the
agent's guardian dies with the agent (parent-death signal), and then its fork server kills and
reaps every tree, in milliseconds unless a process is slow to die, and `forkserver.STOP_LIMIT`
(4 s) at most; a node that Ray declared dead has stopped its workers, or is cut off and kills
them when it learns it. The default fence (5 s) covers the first; a cluster whose nodes may be
partitioned for longer than Ray's own failure detection should raise it.
An agent that does not end its attempt within `KILL_WAIT` of a kill (frozen, or cut off from
this process while Ray counts its node alive) is ended by Ray (`RayClient._force`), and the attempt is
reported lost after Ray's own wait for such a worker (`RAY_KILL_WAIT`) and the fence.
An agent that Ray only ever calls temporarily unavailable (a head node replaced at the same
address: Ray never declares the old one's agents dead) is lost likewise: at once once a kill
was forced on it, or, without a kill, after `UNREACHABLE_LIMIT` (Ray's own wait for its GCS).
A new agent gets its attempt's start only once Ray has placed it (`RayClient._placed`): an agent of the
same shape that is ready meanwhile takes the attempt instead (`RayClient._reuse`), and the new one, never
sent anything, is kept as a spare for the next attempt of that shape (`RayClient._spare`).
An idle agent (kept for the next attempt of its shape) is watched (`RayClient._watch_idle`: a call that
returns once its next attempt starts there): one that Ray says died while kept is forgotten,
and the next attempt of its shape gets a new agent at once. One that died taken, before that
attempt's `placed` came back, had not started it (or, in the moment before its death, had: the
fence covers that tree as any other): after the fence the attempt goes to a new agent instead
of failing.

The attempt's environment travels as on this machine: the supervisor's environ (with the
runtime_env's `env_vars` over it), its cwd where that directory exists on the node, and the
`sys.path` entries that exist there, followed by the agent's own (a runtime_env's working_dir or
py_modules). mpvisor must be importable on every node (installed, or shipped with
`runtime_env={"py_modules": [mpvisor]}`). Ray uploads local code only for a whole job: a
connection this module makes carries the launcher's runtime_env as its job's, which agents
inherit; on another connection it goes to each agent (URIs only). Ray itself is imported only once a `RayLauncher` is
served: `import mpvisor` never imports it.

**Connecting.** `ray.init` runs in a thread of its own, bounded by `start_timeout` (an address
nobody answers at is a `ConfigError`, never a hang); while it runs, what Ray says (its C++ core
writes warnings straight to fd 2, its Python side logs and warns) is kept by `output.RayOutput`, not
shown: the last of it ends the error. A launcher closed while it connects gives the connection
up (the thread releases it if `ray.init` still succeeds), and waits for that when `ray.init` may
be starting a cluster on this machine (`local`; `None` finding no cluster to join): only
`ray.shutdown` stops such a cluster whole.

| file | owns | runs in |
|---|---|---|
| `launcher` | `RayLauncher`: the settings, a `LauncherFactory` | the supervisor's process |
| `client` | `RayClient`: the `Launcher`; each attempt placed (`_Remote`), the agents kept idle (`_Idle`), the fence, the reports | the supervisor's event loop (Ray's blocking calls in threads) |
| `connection` | the process's one connection to Ray: `connect`, `disconnect`, `hold` | a thread of its own while it connects |
| `output` | `RayOutput`: what Ray says while it connects, kept off the terminal | the connecting thread and a reader thread |
| `echo` | `Echo`: attempts' output that nobody captures, written to fd 1 and fd 2 | a writer thread |
| `agent` | `Agent`: the actor, one attempt at a time under a local launcher | a Ray worker, on a node of the cluster |

May import: `_model`, `_launchers.seam`, `_launchers.local`, `_platform`.
"""

from mpvisor._launchers.ray.launcher import DEFAULT_LOST_FENCE, RayLauncher

__all__ = ("DEFAULT_LOST_FENCE", "RayLauncher")
