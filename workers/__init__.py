"""Which targets do the tests, examples and benchmarks run?

Importable task modules whose functions run inside real mpvisor attempts. Every public function
is module-level, takes msgpack values, and accepts `marker=None`: given a file path, it appends
`started <task> <attempt> <pid>` there first (plus `cancel-seen`, `finally`, ... where its
module says), so tests read runs, order and overlap from files, never from logs.

| module | workers |
|---|---|
| `basic` | values, echo, sleep, raise, read stdin, `Fail`/`Fatal`/`Canceled`, flaky and scripted retries, CPU burn, environment probe, pickle bomb, progress |
| `coop` | cancellation: cooperative, shielded, pure-Python loop, async, gated, slow stop, timeout probe, double-cancel counter |
| `misbehave` | `os._exit`, `sys.exit`, SIGSEGV, SIGKILL, stubborn (with a tree), leftovers, output floods, huge and unencodable results, hang |
| `payloads` | summaries (length, SHA-256) of big arguments, for the big-argument tests and `scripts/bench_big_args.py` (no `marker`) |
| `child_errors` | endings that are hard to report: values whose encoding hooks raise, exceptions whose `str()` or traceback raise (no `marker`) |
| `overlap` | the `flock` probe that detects two live owners of a slot |
| `slow_import` | a module that takes 0.7 s to import |
| `hanging_import` | a module whose import never finishes (never import it in the test process) |
| `own_sigterm_import` | a module that puts its own SIGTERM handler in place as it is imported, then waits for a SIGTERM (never import it in the test process) |
| `callback_import` | a module whose import spends its time in weakref callbacks, where a raised exception is swallowed, for up to 60 s (never import it in the test process) |
| `exits_on_import`, `exits_on_import_saying` | modules that call `sys.exit(9)` / `sys.exit("no config: ...")` as they are imported (never import them in the test process) |
| `threads` | targets that return while threads they started still run: a non-daemon thread held until a file exists, an idle thread pool never shut down |
| `cli_probes` | for the command line's tests: a task that logs its interval (a task file's bound on attempts), a long reason |
| `imports` | how the attempt imported it (the launcher's prepared import, or a normal one); logs each import to `$WORKERS_IMPORT_LOG` |

Only `slow_import`, `hanging_import`, `own_sigterm_import`, `callback_import`, the `exits_on_import`
modules and `imports` (which appends a line to a log file, if asked) do anything at import time. No worker spins except
`coop.pure_loop`, which exists to prove that a pure-Python loop still gets `Canceled`, and
`callback_import`'s import, which must spin in callbacks.
"""
