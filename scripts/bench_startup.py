"""What does it cost to start mpvisor, next to what it replaces?

Runs, in one run and interleaved (round after round, each contender in turn, so that a machine
whose speed drifts, as a shared VM's does, slows every contender alike), each contender a fresh
process started from here, with the repository root as its working directory:

| measure | mpvisor | its anchor | goal |
|---|---|---|---|
| a one-task program | `python -c "import mpvisor; mpvisor.run([TaskSpec.once(TaskFn('noop', noop))])"` (`workers.trivial:noop`) | `python -c "... ProcessPoolExecutor(1).submit(noop).result()"` | <= 1.0x |
| a fan-out program | the mpvisor half of `examples/fan_out.py` (`fan_out.with_mpvisor()`, 8 CPU-bound chunks, `max_concurrent=os.cpu_count()`) in a fresh interpreter | the same chunks on `ProcessPoolExecutor()` (written out below, a script of its own) | <= 1.2x |
| the command, a run | `mpvisor run -- true` | `python -c pass` | <= 5x |
| the command, no run | `mpvisor --version`; `mpvisor check FILE` (a two-task file) | `python -c pass` | <= 2.5x |
| a run in a shared slot | `mpvisor run --slot s -- true` | `mpvisor run -- true` | <= 1.1x |
| floors (no goal) | `python -c "import asyncio"` (what any run's supervisor imports); `python -c "import argparse, tomllib, dataclasses"` (what `check` cannot do without); both with the collector off, as mpvisor imports | the anchors of the goals they bound | how much of each goal's budget is left beyond them |
| parent CPU per attempt | in this process: 2,000 trivial attempts, 2 at a time (as `bench_attempts.py`), `getrusage(RUSAGE_SELF)` user+sys / 2,000; beside it, the launcher's CPU (guardian and fork server, psutil) and the attempts' (what the fork server reaped) per attempt | - | <= 0.25 ms |

Wall time is from `Popen` to `wait4`; CPU time is the user+sys `wait4` reports for the process
and every descendant it reaped (an attempt, a launcher, a pool's workers), but not the slot
server, which detaches. Each figure is the median over the rounds; each ratio is the median of
that round's ratios (its spread in brackets), and the goals are on wall time. Every slot-related
run gets `MPVISOR_SLOTS_DIR` of a temporary directory (so does the plain `mpvisor run -- true`
it is compared with); its slot server, started by the first `--slot` run, is stopped at the end.

`--profile` then looks inside `mpvisor run -- true` (and `mpvisor --version`):

- the import time (`-X importtime`) of the parent alone (the flag is taken out of
  `sys._xoptions` before mpvisor starts the launcher, so the launcher does not inherit it), and
  of the guardian/launcher alone (`PYTHONPROFILEIMPORTTIME=1` put into the parent's environment
  after its own start-up, so only the processes it starts inherit it): top imports by cumulative
  time, self time by package, the total (sum of self times); medians of a few runs;
- a timeline of markers, from a `sitecustomize` put on `PYTHONPATH` for the run (an audit hook
  and fork hooks that append a time stamp to a file: interpreter ready, the launcher's `Popen`,
  each fork, the attempt's `exec`) and the events of `--events json`: which process waits for
  which;
- the CPU of the parent alone (its `RUSAGE_SELF` at exit) and of everything below it.

Before measuring, `mpvisor/`, `workers/` and `examples/` are byte-compiled (as `pip install`
does for an installed package; with `PYTHONDONTWRITEBYTECODE=1` nothing else would write the
.pyc files and every run would pay for compiling).

    python scripts/bench_startup.py              # 10 rounds, 2,000 attempts
    python scripts/bench_startup.py --quick      # 3 rounds, 400 attempts
    python scripts/bench_startup.py --profile    # and where `mpvisor run -- true` spends its time
    python scripts/bench_startup.py --instructions   # instead: instructions each process takes (valgrind)
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
MPVISOR = os.path.join(os.path.dirname(PYTHON), "mpvisor")
if not os.access(MPVISOR, os.X_OK):
    MPVISOR = shutil.which("mpvisor") or "mpvisor"
PRIMES_BELOW_LIMIT = 17984  # examples/fan_out.py counts the primes below 200,000

ONE_TASK_MPVISOR = """\
import mpvisor
from mpvisor import TaskFn, TaskSpec
from workers.trivial import noop
outcome = mpvisor.run([TaskSpec.once(TaskFn("noop", noop))])["noop"]
assert outcome.is_success(), outcome
"""

ONE_TASK_POOL = """\
from concurrent.futures import ProcessPoolExecutor
from workers.trivial import noop
with ProcessPoolExecutor(1) as pool:
    assert pool.submit(noop).result() is None
"""

FAN_OUT_MPVISOR = f"""\
import sys
sys.path.insert(0, {os.path.join(ROOT, "examples")!r})
import fan_out
assert fan_out.with_mpvisor() == {PRIMES_BELOW_LIMIT}
"""

# examples/fan_out.py's job, on a pool alone (a script, so that it works under any start method).
FAN_OUT_POOL = f"""\
from concurrent.futures import ProcessPoolExecutor

LIMIT = 200_000
CHUNKS = [(lo, min(lo + 25_000, LIMIT)) for lo in range(0, LIMIT, 25_000)]


def count_primes(lo, hi):
    return sum(1 for n in range(max(lo, 2), hi) if all(n % d for d in range(2, int(n**0.5) + 1)))


if __name__ == "__main__":
    with ProcessPoolExecutor() as pool:
        total = sum(pool.map(count_primes, *zip(*CHUNKS, strict=True)))
    assert total == {PRIMES_BELOW_LIMIT}, total
"""

# An attempt of a target defined in the script that runs the supervisor, the script importing the
# task model at its top as the README's quick start does, and the runtime's `SupervisorConfig` where
# it is used (each attempt executes the script afresh: docs/production.md#costs), against the same target in a module
# of its own; per attempt, one at a time, after a warm-up.
SCRIPT_TARGET = """\
import sys
import time

import mpvisor
from mpvisor import BackoffPolicy, TaskFn, TaskSpec


def noop():
    return None


if __name__ == "__main__":
    import script_target_module
    target = noop if sys.argv[1] == "script" else script_target_module.noop
    mpvisor.run([TaskSpec.once(TaskFn("warm-up", target))])
    specs = [TaskSpec.once(TaskFn(f"t{i}", target)) for i in range(40)]
    began = time.perf_counter()
    outcomes = mpvisor.run(specs, mpvisor.SupervisorConfig(max_concurrent=1))  # (the runtime's, not at the top)
    assert all(o.is_success() for o in outcomes.values()), outcomes
    print((time.perf_counter() - began) / len(specs))
"""

# What `mpvisor check FILE` cannot do without: the command line, a TOML reader, the task model's
# dataclasses (a floor, measured beside the goals it bounds: see FLOORS).
CHECK_FLOOR = "import gc; gc.disable(); import argparse, tomllib, dataclasses"
# What every run's supervisor imports. Both floors import with the collector off, as the console
# script and `mpvisor.run` import the runtime: the cheapest way there is.
ASYNCIO_FLOOR = "import gc; gc.disable(); import asyncio"

# Each goal beside its floor: the standard library that the path must import, whatever mpvisor
# does (a run's supervisor is asyncio; `check` reads TOML into dataclasses). (goal's contender,
# its floor, the goal's anchor, the goal.)
FLOORS = [
    ("one task", "floor: import asyncio", "one task: ProcessPoolExecutor(1)", 1.0),
    ("run", "floor: import asyncio", "python -c pass", 5.0),
    ("check", "floor: import argparse, tomllib, dataclasses", "python -c pass", 2.5),
]

TASK_FILE = """\
[defaults]
restart = "on-failure"
backoff = "0.1:5"

[task.noop]
target = "workers.trivial:noop"
timeout = 60

[task.greet]
command = ["true"]
max_retries = 3
"""

# The parent of `mpvisor run`, as the console script runs it (`from mpvisor._cli.main import main`).
PARENT_IMPORTTIME = (
    "import sys; sys._xoptions.pop('importtime', None); sys.argv[0] = 'mpvisor'; "
    "from mpvisor._cli.main import main; sys.exit(main())"
)
CHILDREN_IMPORTTIME = (
    "import os, sys; os.environ['PYTHONPROFILEIMPORTTIME'] = '1'; sys.argv[0] = 'mpvisor'; "
    "from mpvisor._cli.main import main; sys.exit(main())"
)

# `--profile`'s markers: appended by every Python process of the run (the attempt too, until it execs).
SITECUSTOMIZE = """\
import atexit, os, resource, sys, time

_MARKS = os.environ.get("BENCH_STARTUP_MARKS")


def _mark(what):
    fd = os.open(_MARKS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, f"{time.time():.6f} {os.getpid()} {os.getppid()} {what}\\n".encode())
    os.close(fd)


def _cpu(who):
    usage = resource.getrusage(who)
    return (usage.ru_utime + usage.ru_stime) * 1000


def _hook(event, args, _execd=set()):
    if event == "os.exec" and os.getpid() not in _execd:
        _execd.add(os.getpid())
        _mark("exec " + os.path.basename(os.fsdecode(args[0])))
    elif event == "subprocess.Popen":
        _mark("popen launcher" if "forkserver" in " ".join(map(str, args[1])) else "popen other")
    elif event == "cpython.run_command":
        _mark("run-command")


if _MARKS:
    _mark("python-ready")
    os.register_at_fork(before=lambda: _mark("fork"), after_in_child=lambda: _mark("forked"))
    sys.addaudithook(_hook)
    atexit.register(lambda: _mark(f"atexit {_cpu(resource.RUSAGE_SELF):.3f} {_cpu(resource.RUSAGE_CHILDREN):.3f}"))
"""


@dataclass
class Sample:
    wall: float  # seconds
    cpu: float  # seconds, user+sys of the process and its reaped descendants


@dataclass
class Contender:
    label: str
    argv: list[str]
    env: dict[str, str]
    samples: list[Sample] = field(default_factory=list)


def timed(argv: list[str], env: dict[str, str], stdout: int | None = None) -> tuple[Sample, int, str]:
    """Run `argv` from the repository root; its wall and CPU time, pid and stderr. Raises if it fails."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL if stdout is None else stdout, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{argv} exited with {proc.returncode}: {text[-2000:]}")
    return Sample(wall, usage.ru_utime + usage.ru_stime), proc.pid, text


def clean_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPROFILEIMPORTTIME", None)
    return env


def stop_slot_servers(directory: str) -> int:
    """SIGTERM the slot servers serving `directory` (`mpvisor slots serve ... DIR`), wait until gone."""
    stopped = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = [os.fsdecode(a) for a in f.read().split(b"\0")]
        except OSError:
            continue
        if "serve" in cmdline and directory in cmdline:
            try:
                os.kill(int(entry), signal.SIGTERM)
            except ProcessLookupError:
                continue
            stopped += 1
            deadline = time.monotonic() + 10
            while os.path.exists(f"/proc/{entry}") and time.monotonic() < deadline:
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                            break  # exited; its (detached) zombie is init's to reap
                except OSError:
                    break
                time.sleep(0.01)
    return stopped


def _below_cpu() -> tuple[float, float]:
    """CPU seconds (user+sys) of this process's launchers (guardians and fork servers) so far,
    and of the attempts they reaped."""
    import psutil

    own = reaped = 0.0
    for guardian in psutil.Process().children():
        for process in (guardian, *guardian.children()):
            times = process.cpu_times()
            own += times.user + times.system
            reaped += times.children_user + times.children_system
    return own, reaped


async def _parent_cpu(n: int) -> tuple[float, float, float, float]:
    """Per attempt, in ms: the parent's CPU, the launcher's, the attempt process's; attempts/s."""
    from mpvisor import Supervisor, SupervisorConfig, TaskFn, TaskSpec
    from workers.trivial import noop

    supervisor = Supervisor(SupervisorConfig(max_concurrent=2))
    handle = supervisor.serve()
    counter = iter(range(n))

    async def lane() -> None:
        for i in counter:
            _, waiter = await handle.add_and_watch(TaskSpec.once(TaskFn(f"noop-{i}", noop)))
            outcome = await waiter.wait()
            assert outcome.is_success(), outcome

    warm = TaskSpec.once(TaskFn("warm-up", noop))
    await (await handle.add_and_watch(warm))[1].wait()  # the launcher is up: not counted
    before, below = resource.getrusage(resource.RUSAGE_SELF), _below_cpu()
    start = time.perf_counter()
    await asyncio.gather(lane(), lane())
    wall = time.perf_counter() - start
    after, below_after = resource.getrusage(resource.RUSAGE_SELF), _below_cpu()
    await handle.shutdown()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    launcher, attempts = (below_after[0] - below[0]), (below_after[1] - below[1])
    return cpu / n * 1000, launcher / n * 1000, attempts / n * 1000, n / wall


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.1f}"


def ratio_of(a: Contender, b: Contender, pick: Callable[[Sample], float]) -> tuple[float, float, float]:
    ratios = [pick(x) / pick(y) for x, y in zip(a.samples, b.samples, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


# --- --profile ---------------------------------------------------------------------------------


@dataclass
class Imports:
    """One process's `-X importtime` report, medians over runs: name -> (self, cumulative) in ms."""

    order: list[str] = field(default_factory=list)
    depth: dict[str, int] = field(default_factory=dict)
    own: dict[str, list[float]] = field(default_factory=dict)
    cum: dict[str, list[float]] = field(default_factory=dict)
    totals: list[float] = field(default_factory=list)

    def add(self, stderr: str) -> None:
        total = 0.0
        for line in stderr.splitlines():
            if not line.startswith("import time:"):
                continue
            own, cum, name = line[len("import time:"):].split("|", 2)
            if not own.strip().isdigit():
                continue  # the header line
            depth = (len(name) - len(name.lstrip(" ")) - 1) // 2
            name = name.strip()
            if name not in self.depth:
                self.order.append(name)
                self.depth[name] = depth
            self.own.setdefault(name, []).append(int(own) / 1000)
            self.cum.setdefault(name, []).append(int(cum) / 1000)
            total += int(own) / 1000
        self.totals.append(total)

    def med(self, table: dict[str, list[float]], name: str) -> float:
        return statistics.median(table[name])

    def report(self, title: str, top: int) -> None:
        total = statistics.median(self.totals)
        print(f"\n{title}: {len(self.order)} modules, import time {total:.1f} ms in all (sum of self times)")
        print(f"  top {top} by cumulative time (indented: imported by the line above it that is less indented)")
        print(f"  {'cum ms':>7s} {'self ms':>7s}  module")
        ranked = sorted(self.order, key=lambda n: -self.med(self.cum, n))[:top]
        for name in ranked:
            print(f"  {self.med(self.cum, name):7.1f} {self.med(self.own, name):7.1f}  "
                  f"{'  ' * self.depth[name]}{name}")
        roots = [n for n in self.order if self.depth[n] == 0]
        print("  imported at top level (in order; cumulative ms): " + ", ".join(
            f"{n} {self.med(self.cum, n):.1f}" for n in roots if self.med(self.cum, n) >= 0.5))
        groups: dict[str, float] = {}
        for name in self.order:
            parts = name.split(".")
            group = ".".join(parts[:2]) if parts[0] == "mpvisor" else parts[0]
            groups[group] = groups.get(group, 0.0) + self.med(self.own, name)
        ranked_groups = sorted(groups.items(), key=lambda kv: -kv[1])[:12]
        print("  self time by package (ms): " + ", ".join(f"{g} {t:.1f}" for g, t in ranked_groups))
        mpv = sum(t for g, t in groups.items() if g.startswith("mpvisor"))
        print(f"  mpvisor's own modules: {mpv:.1f} ms self; everything else: {total - mpv:.1f} ms")


def import_profiles(runs: int, base: dict[str, str]) -> None:
    parent, children, version = Imports(), Imports(), Imports()
    for _ in range(runs):
        _, _, err = timed([PYTHON, "-X", "importtime", "-c", PARENT_IMPORTTIME, "run", "--", "true"], base)
        parent.add(err)
        _, _, err = timed([PYTHON, "-c", CHILDREN_IMPORTTIME, "run", "--", "true"], base)
        children.add(err)
        _, _, err = timed([PYTHON, "-X", "importtime", "-c", PARENT_IMPORTTIME, "--version"], base)
        version.add(err)
    parent.report("parent of `mpvisor run -- true`", 15)
    children.report("guardian/launcher of `mpvisor run -- true` (imports before it forks the launcher)", 10)
    version.report("`mpvisor --version`", 15)


def timeline(runs: int, base: dict[str, str], work: str) -> None:
    site = os.path.join(work, "site")
    os.makedirs(site, exist_ok=True)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE)
    marks: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for i in range(runs):
        path = os.path.join(work, f"marks-{i}")
        env = dict(base, BENCH_STARTUP_MARKS=path,
                   PYTHONPATH=os.pathsep.join(p for p in (site, base.get("PYTHONPATH", "")) if p))
        with tempfile.TemporaryFile() as out:
            t0 = time.time()
            sample, parent, _ = timed([MPVISOR, "run", "--events", "json", "--", "true"], env, out.fileno())
            t_end = time.time()
            out.seek(0)
            events = [json.loads(line) for line in out.read().decode().splitlines() if line.startswith("{")]
        found: dict[str, float] = {"bench: Popen of `mpvisor run`": t0, "bench: wait4 returns": t_end}
        roles = {parent: "parent"}
        with open(path) as f:
            lines = [line.split(maxsplit=3) for line in f.read().splitlines()]
        for stamp, pid_s, ppid_s, what in lines:
            pid, ppid = int(pid_s), int(ppid_s)
            if pid not in roles and roles.get(ppid) == "parent":
                roles[pid] = "guardian"
            elif pid not in roles and what == "forked":
                roles[pid] = {"guardian": "launcher", "launcher": "attempt"}.get(roles.get(ppid, ""), "?")
            role = roles.get(pid, "?")
            if what.startswith("atexit"):
                _, self_ms, children_ms = what.split()
                cpu.setdefault("parent itself (RUSAGE_SELF at exit)", []).append(float(self_ms))
                cpu.setdefault("what the parent reaped by then (RUSAGE_CHILDREN)", []).append(float(children_ms))
                what = "atexit"
            label = {
                ("parent", "python-ready"): "parent: interpreter and site ready",
                ("parent", "popen launcher"): "parent: Popen of the guardian (launcher start requested)",
                ("parent", "atexit"): "parent: atexit (about to exit)",
                ("guardian", "python-ready"): "guardian: interpreter and site ready",
                ("guardian", "run-command"): "guardian: its -c code starts (imports mpvisor's forkserver)",
                ("guardian", "fork"): "guardian: forks the launcher (imports done)",
                ("launcher", "forked"): "launcher: running",
                ("launcher", "fork"): "launcher: forks the attempt",
                ("attempt", "forked"): "attempt: running (forked)",
            }.get((role, what))
            if what.startswith("exec") and role == "attempt":
                label = f"attempt: {what} (the command)"
            if label is not None and label not in found:
                found[label] = float(stamp)
        for event in events:
            if event.get("kind") in ("task_add_requested", "attempt_starting", "attempt_succeeded", "all_stopped_within_grace"):
                found.setdefault(f"parent: event {event['kind']}", float(event["at"]))
        for label, at in found.items():
            marks.setdefault(label, []).append((at - t0) * 1000)
        cpu.setdefault("whole tree (wait4)", []).append(sample.cpu * 1000)
        cpu.setdefault("wall", []).append(sample.wall * 1000)
    print(f"\ntimeline of `mpvisor run --events json -- true` (with the marker sitecustomize; ms after the bench's Popen, median of {runs} runs)")
    for label, values in sorted(marks.items(), key=lambda kv: statistics.median(kv[1])):
        print(f"  {statistics.median(values):7.1f}  {label}" + ("" if len(values) == runs else f"  (in {len(values)} of {runs} runs)"))
    own = statistics.median(cpu["parent itself (RUSAGE_SELF at exit)"])
    below = statistics.median(cpu["what the parent reaped by then (RUSAGE_CHILDREN)"])
    tree = statistics.median(cpu["whole tree (wait4)"])
    print(f"  CPU of the whole tree {tree:.1f} ms (wall {statistics.median(cpu['wall']):.1f} ms): the parent until its atexit "
          f"{own:.1f} ms; guardian + launcher + attempt (reaped by then) {below:.1f} ms; after the atexit "
          f"(the parent's interpreter finalization) {tree - own - below:.1f} ms")


def medians(runs: int, base: dict[str, str], programs: list[str]) -> list[Sample]:
    """Median wall and CPU of each `python -c PROGRAM`, interleaved."""
    samples: list[list[Sample]] = [[] for _ in programs]
    for _ in range(runs):
        for program, into in zip(programs, samples, strict=True):
            into.append(timed([PYTHON, "-c", program], base)[0])
    return [Sample(statistics.median(s.wall for s in x), statistics.median(s.cpu for s in x)) for x in samples]


def processes_alone(runs: int, base: dict[str, str]) -> None:
    """The guardian's start-up without the parent; what the parent's exit costs; a fan-out attempt's import."""
    forkserver = "from mpvisor._launchers.local.forkserver import main"
    cli = "import mpvisor._cli.run"
    bare, guardian, normal, collected, skipped = medians(runs, base, [
        "pass", forkserver, cli, cli + ", gc, os; gc.collect(); os._exit(0)", cli + ", os; os._exit(0)"])
    print(f"\nprocesses alone (median of {runs}; wall / CPU ms): python -c pass {bare.wall * 1000:.1f} / {bare.cpu * 1000:.1f}")
    print(f"  the guardian's start-up, `python -c \"{forkserver}\"`: {guardian.wall * 1000:.1f} / {guardian.cpu * 1000:.1f}")
    print(f"  the parent's exit, `python -c \"{cli}\"`: {normal.wall * 1000:.1f} / {normal.cpu * 1000:.1f}; ending in "
          f"os._exit(0) instead: {skipped.wall * 1000:.1f} / {skipped.cpu * 1000:.1f} (finalization "
          f"{(normal.wall - skipped.wall) * 1000:.1f} ms, of which a full gc.collect() {(collected.wall - skipped.wall) * 1000:.1f} ms)")
    fan_out = Imports()
    code = f"import mpvisor._launchers.local.forkserver, sys; sys.path.insert(0, {os.path.join(ROOT, 'examples')!r}); import fan_out"
    for _ in range(runs):
        fan_out.add(timed([PYTHON, "-X", "importtime", "-c", code], base)[2])
    loaded = [n for n in fan_out.order if n == "fan_out" or fan_out.order.index(n) > fan_out.order.index("mpvisor._launchers.local.forkserver")]
    print(f"  each fan-out attempt executes examples/fan_out.py afresh; in a process that has the launcher's modules, `import fan_out` "
          f"takes {fan_out.med(fan_out.cum, 'fan_out'):.1f} ms cumulative, importing {len(loaded) - 1} modules the launcher has not: "
          + ", ".join(f"{n} {fan_out.med(fan_out.cum, n):.1f}" for n in sorted(loaded, key=lambda n: -fan_out.med(fan_out.cum, n))[1:7]))


# --- main --------------------------------------------------------------------------------------


GOALS = [  # (contender, its anchor, the goal on their wall-time ratio)
    ("one task: mpvisor.run", "one task: ProcessPoolExecutor(1)", 1.0),
    ("fan_out.with_mpvisor()", "fan-out on ProcessPoolExecutor()", 1.2),
    ("mpvisor run -- true", "python -c pass", 5.0),
    ("mpvisor --version", "python -c pass", 2.5),
    ("mpvisor check FILE", "python -c pass", 2.5),
    ("mpvisor run --slot s -- true", "mpvisor run -- true", 1.1),
]


def instructions(contenders: list[Contender], anchors: dict[str, str]) -> None:
    """`--instructions`: the instructions each contender's own process executes (valgrind's
    callgrind, `PYTHONHASHSEED=0`; not its children), which repeat to a tenth of a per cent
    whatever else the machine does, where wall times drift by a fifth: how a change to start-up
    is measured (docs/benchmarks.md). Ratios to each one's anchor beside them."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        sys.exit("--instructions needs valgrind (Debian and Ubuntu: apt install valgrind)")
    counted: dict[str, float] = {}
    for c in contenders:
        env = dict(c.env, PYTHONHASHSEED="0")
        done = subprocess.run([valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null", *c.argv],
                              env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        found = [line for line in done.stderr.splitlines() if "Collected" in line]
        if not found:
            sys.exit(f"valgrind counted nothing for {c.label}: {done.stderr[-500:]}")
        counted[c.label] = int(found[-1].split()[-1]) / 1e6
    print(f"{'process (alone, not its children)':52s} {'instructions':>14s}  vs its anchor")
    for label, count in counted.items():
        anchor = anchors.get(label)
        beside = f"{count / counted[anchor]:.2f}x {anchor}" if anchor in counted else ""
        print(f"{label:52s} {count:12.1f} M  {beside}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run (3 rounds, 400 attempts)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 10, 3 with --quick)")
    parser.add_argument("--attempts", type=int, default=None, help="attempts for the parent's CPU (default 2000)")
    parser.add_argument("--profile", action="store_true", help="also: where `mpvisor run -- true` spends its time")
    parser.add_argument("--instructions", action="store_true",
                        help="instead: the instructions each process takes, under valgrind (repeatable on a drifting machine)")
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.quick else 10)
    attempts = args.attempts or (400 if args.quick else 2000)
    for directory in ("mpvisor", "workers", "examples"):
        compileall.compile_dir(os.path.join(ROOT, directory), quiet=1)

    work = tempfile.mkdtemp(prefix="bench-startup-")
    slots_dir = os.path.join(work, "slots")
    os.makedirs(slots_dir, mode=0o700)
    os.chmod(slots_dir, 0o700)  # the slot server refuses a directory open to others
    task_file = os.path.join(work, "tasks.toml")
    with open(task_file, "w") as f:
        f.write(TASK_FILE)
    pool_script = os.path.join(work, "fan_out_pool.py")
    with open(pool_script, "w") as f:
        f.write(FAN_OUT_POOL)
    base = clean_env()
    slotted = dict(base, MPVISOR_SLOTS_DIR=slots_dir)
    contenders = [
        Contender("python -c pass", [PYTHON, "-c", "pass"], base),
        Contender("one task: mpvisor.run", [PYTHON, "-c", ONE_TASK_MPVISOR], base),
        Contender("one task: ProcessPoolExecutor(1)", [PYTHON, "-c", ONE_TASK_POOL], base),
        Contender("fan_out.with_mpvisor()", [PYTHON, "-c", FAN_OUT_MPVISOR], base),
        Contender("fan-out on ProcessPoolExecutor()", [PYTHON, pool_script], base),
        Contender("mpvisor run -- true", [MPVISOR, "run", "--", "true"], slotted),
        Contender("mpvisor run --slot s -- true", [MPVISOR, "run", "--slot", "s", "--", "true"], slotted),
        Contender("mpvisor --version", [MPVISOR, "--version"], base),
        Contender("mpvisor check FILE", [MPVISOR, "check", task_file], base),
        Contender("floor: import asyncio", [PYTHON, "-c", ASYNCIO_FLOOR], base),
        Contender("floor: import argparse, tomllib, dataclasses", [PYTHON, "-c", CHECK_FLOOR], base),
    ]
    by = {c.label: c for c in contenders}
    if args.instructions:
        guardian = Contender("the guardian's start-up (imports)", [PYTHON, "-c", "from mpvisor._launchers.local.forkserver import main"], base)
        alone = [c for c in contenders if "slot" not in c.label]
        pairs = {label: anchor for label, anchor, _ in GOALS if "slot" not in label}
        pairs.update({floor: anchor for _, floor, anchor, _ in FLOORS})
        instructions([*alone[:1], guardian, *alone[1:]], pairs)
        shutil.rmtree(work, ignore_errors=True)
        return
    try:
        for _ in range(rounds):
            for contender in contenders:
                contender.samples.append(timed(contender.argv, contender.env)[0])
    finally:
        servers = stop_slot_servers(slots_dir)

    print(f"{rounds} interleaved rounds; {os.cpu_count()} CPUs; {sys.version.split()[0]}; mpvisor = {MPVISOR}")
    print(f"{'contender':36s} {'wall ms':>8s} {'(min-max)':>15s} {'CPU ms':>8s}")
    for c in contenders:
        walls = [s.wall for s in c.samples]
        print(f"{c.label:36s} {ms(statistics.median(walls))} {min(walls) * 1000:7.1f}-{max(walls) * 1000:<7.1f} "
              f"{ms(statistics.median(s.cpu for s in c.samples))}")
    print(f"(slot servers stopped at the end: {servers})")

    print(f"\n{'contender vs anchor':68s} {'wall x (rounds)':>20s} {'CPU x':>7s} {'goal':>8s}")
    for label, anchor, goal in GOALS:
        wall, lo, hi = ratio_of(by[label], by[anchor], lambda s: s.wall)
        cpu, _, _ = ratio_of(by[label], by[anchor], lambda s: s.cpu)
        verdict = "PASS" if wall <= goal else "MISS"
        print(f"{label + ' vs ' + anchor:68s} {wall:6.2f}x ({lo:.2f}-{hi:.2f}) {cpu:6.2f}x {'<= ' + format(goal, '.1f') + 'x':>8s} {verdict}")

    print(f"\n{'floor vs anchor (the standard library a path cannot do without)':68s} {'wall x (rounds)':>20s} {'CPU x':>7s}")
    for label, floor, anchor, goal in FLOORS:
        wall, lo, hi = ratio_of(by[floor], by[anchor], lambda s: s.wall)
        cpu, _, _ = ratio_of(by[floor], by[anchor], lambda s: s.cpu)
        budget = goal * statistics.median(s.wall for s in by[anchor].samples)
        left = budget - statistics.median(s.wall for s in by[floor].samples)
        print(f"{floor + ' vs ' + anchor:68s} {wall:6.2f}x ({lo:.2f}-{hi:.2f}) {cpu:6.2f}x  "
              f"{label}'s goal {goal:.1f}x leaves {left * 1000:.1f} ms beyond it")

    per_attempt, launcher, attempt, rate = asyncio.run(_parent_cpu(attempts))
    verdict = "PASS" if per_attempt <= 0.25 else "MISS"
    print(f"{f'parent CPU per attempt ({attempts} trivial attempts, 2 at a time)':68s} {per_attempt:6.3f} ms "
          f"{'':13s} {'<= 0.25 ms':>10s} {verdict}  ({per_attempt / 0.25:.1f}x the goal; {rate:.0f} attempts/s)")
    print(f"{'  beside it, per attempt: the launcher (guardian + fork server)':68s} {launcher:6.3f} ms; "
          f"the attempt process itself {attempt:.3f} ms")

    script = os.path.join(work, "script_target.py")
    with open(script, "w") as f:
        f.write(SCRIPT_TARGET)
    with open(os.path.join(work, "script_target_module.py"), "w") as f:
        f.write("def noop():\n    return None\n")
    per = {"script": [], "module": []}
    for _ in range(2 if args.quick else 5):
        for where in per:
            done = subprocess.run([PYTHON, script, where], env=base, cwd=work, capture_output=True, text=True, check=True)
            per[where].append(float(done.stdout))
    in_script, in_module = (statistics.median(per[w]) * 1000 for w in ("script", "module"))
    print(f"{'an attempt of a target in the script that imports the task model':68s} {in_script:6.2f} ms; "
          f"in a module of its own {in_module:.2f} ms (one at a time, 40 attempts)")

    if args.profile:
        runs = 2 if args.quick else 5
        print(f"\n--profile: `mpvisor run -- true` and `mpvisor --version`, medians of {runs} runs")
        import_profiles(runs, base)
        timeline(runs, base, work)
        processes_alone(2 * runs, base)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, ROOT)  # workers.trivial, for the parent's CPU per attempt
    main()
