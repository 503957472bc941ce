"""Do the examples in examples/ run as a user runs them, and print what they promise?

Each example is copied into a fresh temporary directory outside the repository and run from
there with the installed interpreter (`sys.executable`), bash, or the installed `mpvisor`
executable (`shutil.which`), with a timeout; each test asserts on the example's exit status and
output. The examples' targets are defined in the example files themselves (or, for the task
file, in the module beside it), so the directory they run in holds nothing of the repository:
`PYTHONPATH` is a directory with a single link to this checkout's `mpvisor` package, so that
they import the code under test even where a non-editable install of an older mpvisor sits in
site-packages, and nothing else of the repository (no `workers`, no `tests`). Every run gets a
private slot-server directory (`MPVISOR_SLOTS_DIR`), whose server is stopped afterwards. The
Ray example runs last, on the session's Ray cluster (`RAY_ADDRESS`), never starting its own.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mpvisor._admission.leases import local as _leases
from tests._slot_support import stop_servers
from tests._support import wait_for

pytestmark = pytest.mark.timeout(90)

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
MPVISOR = shutil.which("mpvisor")
RUN_TIMEOUT = 60.0  # seconds: each example takes one or two


@pytest.fixture(scope="session")
def checkout_only(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A directory that holds only a link to this checkout's `mpvisor` package."""
    directory = tmp_path_factory.mktemp("pythonpath")
    (directory / "mpvisor").symlink_to(ROOT / "mpvisor", target_is_directory=True)
    return directory


@pytest.fixture
def user(tmp_path: pathlib.Path, checkout_only: pathlib.Path) -> Iterator[User]:
    """A user's directory outside the repository, and the environment its commands run with."""
    user = User(tmp_path / "project", checkout_only, tmp_path / "slots")
    yield user
    user.stop_slot_server()


class User:
    def __init__(self, home: pathlib.Path, pythonpath: pathlib.Path, slots: pathlib.Path) -> None:
        home.mkdir()
        self.home = home
        self.slots = slots
        self.env = {**os.environ, "PYTHONPATH": str(pythonpath), _leases.DIR_ENV: str(slots)}

    def copy(self, *names: str) -> None:
        for name in names:
            shutil.copy2(EXAMPLES / name, self.home / name)

    def start(self, argv: list[str], **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen(argv, cwd=self.home, env={**self.env, **env}, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def run(self, argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
        """Run `argv` to its end; fail with its output unless it exits 0."""
        proc = self.start(argv, **env)
        try:
            out, err = proc.communicate(timeout=RUN_TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, f"{argv} exited {proc.returncode}\nstdout:\n{out}\nstderr:\n{err}"
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def python(self, example: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """Copy `example` into the user's directory and run it there with the installed interpreter."""
        self.copy(example)
        return self.run([sys.executable, example, *args], **env)

    def stop_slot_server(self) -> None:
        stop_servers(self.slots)


def primes_below(limit: int) -> int:
    sieve = bytearray([1]) * limit
    sieve[:2] = b"\0\0"
    for n in range(2, int(limit**0.5) + 1):
        if sieve[n]:
            sieve[n * n::n] = bytes(len(range(n * n, limit, n)))
    return sum(sieve)


def test_fan_out_gives_the_process_pools_answer(user: User) -> None:
    """examples/fan_out.py: the chunks' total through mpvisor equals ProcessPoolExecutor's, and both are right."""
    lines = user.python("fan_out.py").stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["mpvisor", "ProcessPoolExecutor", "both agree"], lines
    expected = primes_below(200_000)
    assert all(line.split(": ")[1].startswith(f"{expected} primes below 200000 in 8 chunks") for line in lines[:2]), lines


def test_resident_worker_finishes_its_job_and_saves_its_state_when_cancelled(user: User) -> None:
    """examples/resident_worker.py: jobs reported as progress, then a cancel ends it CANCELED
    after its `finally` saved how many jobs it did."""
    lines = user.python("resident_worker.py").stdout.splitlines()
    assert lines[:3] == ["indexer: job 1 done", "indexer: job 2 done", "indexer: job 3 done"], lines
    stopped, saved = lines[-1].split(", saved ")
    assert stopped == "indexer stopped: outcome_canceled", lines
    state = ast.literal_eval(saved)
    assert state["jobs_done"] >= 3 and state["attempt"] == 1, lines


def test_tenant_sync_keeps_only_the_newest_sync_of_a_tenant(user: User) -> None:
    """examples/tenant_sync.py: the running sync is replaced, the requests in between are
    superseded, the newest completes, and the other tenant is untouched."""
    assert user.python("tenant_sync.py").stdout.splitlines() == [
        "acme r1: outcome_canceled (replaced by a newer submission in slot 'tenant-acme')",
        "acme r2: outcome_rejected (superseded by a replacement while queued)",
        "acme r3: outcome_rejected (superseded by a replacement while queued)",
        "acme r4: outcome_completed (acme synced at revision 4)",
        "globex r1: outcome_completed (globex synced at revision 1)",
    ]


def test_periodic_job_drops_the_ticks_that_find_it_running(user: User) -> None:
    """examples/periodic_job.py: the first tick runs, the next (0.2 s later, while the 0.5 s
    report runs) is dropped, and every tick either ran or was dropped."""
    lines = user.python("periodic_job.py").stdout.splitlines()
    assert lines[0] == "tick 1: ran: report of tick 1", lines
    assert lines[1] == "tick 2: dropped, the previous report was still running", lines
    ran = sum(": ran: " in line for line in lines)
    dropped = sum(": dropped," in line for line in lines)
    assert ran + dropped == 6 and lines[-1] == f"6 ticks: {ran} ran, {dropped} dropped", lines


def test_metrics_example_scrapes_itself_over_http(user: User) -> None:
    """examples/metrics_http.py: its own /metrics, fetched over HTTP, shows the failed and the
    retried attempt, the restart, both start latencies and the completed task."""
    lines = user.python("metrics_http.py").stdout.splitlines()
    assert lines[0].startswith("scraped http://127.0.0.1:") and lines[0].endswith("/metrics"), lines
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families("\n".join(lines[1:]) + "\n") for s in family.samples}
    assert samples == {
        ("mpvisor_attempts_total", (("result", "failed"),)): 1.0,
        ("mpvisor_attempts_total", (("result", "succeeded"),)): 1.0,
        ("mpvisor_restarts_total", (("source", "failure"),)): 1.0,
        ("mpvisor_attempt_start_latency_seconds_count", ()): 2.0,
        ("mpvisor_task_outcomes_total", (("outcome", "outcome_completed"),)): 1.0,
    }, lines


def test_two_concurrent_deploys_of_one_environment_take_turns(user: User) -> None:
    """examples/deploy.sh under bash, twice at once for the same environment: the second waits
    in the slot's queue while the first deploys, deploys after the first has ended, and both
    exit 0 saying so. The first deploy lasts until the second says it waits (then the test ends
    its `sleep`): the turn it must not lose is then sure to be taken."""
    assert MPVISOR is not None, "the mpvisor executable is not on PATH"
    user.copy("deploy.sh")
    log = user.home / "deploy-prod.log"
    path = f"{os.path.dirname(MPVISOR)}{os.pathsep}{os.environ.get('PATH', '')}"
    first = user.start(["bash", "deploy.sh", "prod", "v1"], DEPLOY_SECONDS=str(RUN_TIMEOUT), PATH=path)
    try:
        wait_for(lambda: log.exists() and "start v1" in log.read_text(), timeout=30)
        second = user.start(["bash", "deploy.sh", "prod", "v2"], DEPLOY_SECONDS="0.1", PATH=path)
        said = ""
        while "waiting, position 1" not in said:
            line = second.stderr.readline() if second.stderr else ""
            assert line, f"v2 ended without saying it waits: {said!r}"
            said += line
        [deploying] = [p for p in psutil.Process(first.pid).children(recursive=True) if p.name() == "sleep"]
        deploying.terminate()  # v1's deploy ends now (it then logs its end, and exits 0)
        results = [proc.communicate(timeout=RUN_TIMEOUT) for proc in (first, second)]
    finally:
        if first.poll() is None:  # a failure above: its deploy would sleep on
            for process in psutil.Process(first.pid).children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
            first.kill()
            first.wait(timeout=10)
    assert [first.returncode, second.returncode] == [0, 0], results
    assert [out for out, _ in results] == ["v1: deployed to prod\n", "v2: deployed to prod\n"], results
    events = [line.split() for line in log.read_text().splitlines()]
    assert [(word, version) for word, version, _ in events] == [("start", "v1"), ("end", "v1"), ("start", "v2"), ("end", "v2")]
    assert float(events[1][2]) <= float(events[2][2]), events  # v2 began only after v1 ended


def test_the_task_file_runs_and_checks(user: User) -> None:
    """examples/tasks.toml with its module: `mpvisor check` accepts it, and `mpvisor run --file`
    runs its three tasks (one retried, one a program on a shared slot): exit 0, the Python
    targets' values as one JSON line on stdout."""
    assert MPVISOR is not None, "the mpvisor executable is not on PATH"
    user.copy("tasks.toml", "nightly.py")
    user.run([MPVISOR, "check", "tasks.toml"])
    done = user.run([MPVISOR, "run", "--file", "tasks.toml"])
    assert json.loads(done.stdout) == {"fetch": 3, "report": "report of sales"}, done
    outcomes = [line for line in done.stderr.splitlines() if ": completed " in line]
    assert len(outcomes) == 3 and any(line.startswith("mpvisor: fetch: completed") and "attempts=2" in line
                                      for line in outcomes), done.stderr
    assert "published the sales report" in done.stderr, done.stderr


@pytest.mark.ray
def test_ray_example_runs_its_attempts_on_the_cluster_it_is_given(user: User, on_ray: Any) -> None:
    """examples/ray_launcher.py with RAY_ADDRESS set to the session's cluster: the first
    attempt fails on the cluster and the retry completes there. (Ray starts the agents' workers
    itself, outside `PYTHONPATH`: they import the installed mpvisor, whose code must be this
    checkout's, installed editable or not.)"""
    plain = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    installed = pathlib.Path(subprocess.run(
        [sys.executable, "-c", "import mpvisor; print(mpvisor.__file__)"], cwd=user.home,
        env=plain, capture_output=True, text=True, timeout=30, check=True).stdout.strip()).parent
    ours = ROOT / "mpvisor"
    stale = [str(path.relative_to(ours)) for path in ours.rglob("*.py")
             if not (installed / path.relative_to(ours)).is_file()
             or (installed / path.relative_to(ours)).read_bytes() != path.read_bytes()]
    assert stale == [], f"the installed mpvisor ({installed}) is not this checkout's: {stale}; reinstall it"
    done = user.python("ray_launcher.py", RAY_ADDRESS=on_ray.address)
    lines = done.stdout.splitlines()
    assert lines[0] == f"cluster: {on_ray.address}", lines
    head, value = lines[1].split(": ", 2)[1:]
    assert head == "COMPLETED after 2 attempts", lines
    where = ast.literal_eval(value)
    assert where["attempt"] == 2 and where["label"] == "on-ray", lines


def test_the_services_file_starts_in_order_answers_status_and_stops_dependents_first(user: User) -> None:
    """examples/services.toml with its module (on a free port): `mpvisor check` accepts it; the run
    makes db ready, then api (its `ready()`) and job; `mpvisor status` from another process says
    so; each task logs to logs/TASK.log; SIGTERM stops api and job before db, and the run dies by it."""
    import signal
    import socket

    assert MPVISOR is not None, "the mpvisor executable is not on PATH"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    user.copy("services_app.py")
    (user.home / "services.toml").write_text((EXAMPLES / "services.toml").read_text().replace("15432", port))
    control = {"MPVISOR_CONTROL_DIR": str(user.home / "control")}
    user.run([MPVISOR, "check", "services.toml"])
    proc = user.start([MPVISOR, "run", "--file", "services.toml"], **control)

    def rows() -> dict[str, Any] | None:
        done = subprocess.run([MPVISOR, "status", "services.toml", "--json"], cwd=user.home, env={**user.env, **control},
                              capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            assert proc.poll() is None, proc.communicate()
            return None
        found = {row["task"]: row for row in json.loads(done.stdout)["tasks"]}
        ready = found["db"]["ready"] and found["api"]["ready"] and found["api"]["status"] == "serving"
        return found if ready and found["job"]["state"] in ("scheduled", "running") else None

    try:
        wait_for(rows, timeout=30)
        # db waits for its stop (ready is its port listening: it may not have got to its wait yet)
        wait_for(lambda: "db: listening" in (user.home / "logs" / "db.log").read_text()
                 if (user.home / "logs" / "db.log").exists() else False)
        wait_for(lambda: "job: ran" in (user.home / "logs" / "job.log").read_text() if (user.home / "logs" / "job.log").exists() else False)
        assert "api: serving" in (user.home / "logs" / "api.log").read_text()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGTERM, err
    order = [line.split(":")[1].strip() for line in err.splitlines() if ": canceled " in line]
    assert order[-1] == "db" and set(order) == {"api", "job", "db"}, err
    assert "db: stopping" in (user.home / "logs" / "db.log").read_text()
