"""Shared fixtures: every test leaves no process behind, and async tests run on a fresh loop.

An `async def test_...` function runs on a fresh event loop of its own (`asyncio.Runner`, as
`asyncio.run` runs one), with its fixture arguments, exactly as pytest calls a plain test:
`pytest_pyfunc_call` below is the whole mechanism (no plugin needed). One difference from
`asyncio.run`: the tasks a test leaves get `CLEANUP_WAIT` s to end once canceled, and one that
does not fails the test with its stack, where `asyncio.run` would wait for it forever. `run(coro)` from tests/_support.py stays for the few sync
tests that run a coroutine for a reason (code that must run after the loop closed, or two
loops in one test). Pure tests that start no process are marked `unit` (`pytest -m unit`).

A module marked `both_start_methods` (`pytestmark`) runs each of its tests once per start method
(`pytest_generate_tests` below; `supervised(...)` applies it); `both_start_methods(spawn="slow")`
leaves the spawn runs to `-m slow`.

The autouse fixture `no_leftover_processes` fails a test that leaves a descendant of the test
process running (a launcher, an attempt, a descendant) once its own shutdown is done; it kills
those processes by pid first, so that one leaking test does not make every later test fail.

The default run is spread over three processes by pytest-xdist (`-n 3 --dist loadgroup` in
pyproject.toml; `-n 0` runs it in this process alone). What tests running at once could
share is kept apart (`pytest_configure`): each test process has slot and control directories of
its own (`$MPVISOR_SLOTS_DIR`, `$MPVISOR_CONTROL_DIR`: a test of the defaults removes them from
the environment it gives), the temporary directories are short (a Unix socket's path has 107
bytes), and the venvs are built once for all of them (tests/_prebuild.py). The Ray tests run in one
process, which starts the session's one Ray cluster, and so do the tests of the tools venv,
which look for their processes by its path, the limits' tests, which look for the attempt
cgroups they left, and the docs' tests, which share a costly module fixture (tests/_groups.py).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import pathlib
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tests import _prebuild, _support  # noqa: E402
from tests._support import kill_leftovers  # noqa: E402

LEFTOVER_WAIT = 3.0  # seconds a test's processes may take to go after the test ends


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Keep apart what test processes running at once could share (module docstring). On the xdist
    controller: a short base for the temporary directories, and the directory of the workers'
    shared builds. In every test process (a worker, or a run without xdist): slot and control
    directories of its own."""
    global _own_dirs
    worker = hasattr(config, "workerinput")
    if not worker and getattr(config.option, "numprocesses", None):
        if not config.option.basetemp:
            # /tmp/pytest-of-<user>/pytest-<n>/popen-gw0/<test>0/: a socket's path under a test's
            # directory would pass 107 bytes where a run without xdist stays under them
            config.option.basetemp = tempfile.mkdtemp(prefix="pt-", dir="/tmp")
            config.stash[_BASETEMP] = config.option.basetemp
        os.environ[_prebuild.SHARED] = tempfile.mkdtemp(prefix="mpvisor-tests-builds-")
        os.environ[_prebuild.OWNER] = str(os.getpid())
        config.pluginmanager.register(_Scheduler(), "mpvisor-groups")
        return
    _own_dirs = tempfile.mkdtemp(prefix="mpvisor-t-", dir="/tmp")
    os.environ["MPVISOR_SLOTS_DIR"] = os.path.join(_own_dirs, "slots")
    os.environ["MPVISOR_CONTROL_DIR"] = os.path.join(_own_dirs, "runs")


class _Scheduler:
    """The xdist controller's scheduler: `--dist loadgroup` with the groups of tests/_groups.py."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: object) -> object:
        if config.getvalue("dist") != "loadgroup":
            return None
        from tests import _groups

        return _groups.GroupScheduling(config, log)


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    if _own_dirs is not None:
        shutil.rmtree(_own_dirs, ignore_errors=True)
    if not hasattr(config, "workerinput") and os.environ.get(_prebuild.SHARED):
        _prebuild.finish_shared(pathlib.Path(os.environ[_prebuild.SHARED]))
    if config.stash.get(_BASETEMP, None) and config.stash.get(_PASSED, False):
        shutil.rmtree(config.stash[_BASETEMP], ignore_errors=True)  # kept, for a look, when a test failed


_own_dirs: str | None = None
_BASETEMP = pytest.StashKey[str]()
_PASSED = pytest.StashKey[bool]()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Byte-compile the checkout's packages once, as `pip install` does for an installed one:
    every attempt, launcher and `mpvisor` process of the suite imports `workers` (and, from an
    editable install, `mpvisor`) from here, and with `PYTHONDONTWRITEBYTECODE` set (as on the
    CI machine) each of them would otherwise compile those modules again from source."""
    import compileall

    for package in ("mpvisor", "workers", "examples"):
        compileall.compile_dir(os.path.join(ROOT, package), quiet=2)


CLEANUP_WAIT = 30.0  # seconds the tasks a test left get to end once canceled


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run an `async def` test on a fresh event loop, passing its fixture arguments."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    funcargs = pyfuncitem.funcargs
    runner = asyncio.Runner()
    try:
        runner.run(pyfuncitem.obj(**{name: funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}))
    finally:
        _close(runner)
    return True


def _close(runner: asyncio.Runner) -> None:
    """`Runner.close`, as `asyncio.run` ends, but with the wait for the tasks the test left
    (canceled) bounded: a task that does not end within `CLEANUP_WAIT` s fails the test with
    its stack, where `asyncio.run` would wait for it forever (after a pytest-timeout too, whose
    alarm fires once), and the suite goes on."""
    loop = runner.get_loop()
    left = asyncio.all_tasks(loop)
    for task in left:
        task.cancel()
    if left:
        done, pending = loop.run_until_complete(asyncio.wait(left, timeout=CLEANUP_WAIT))
        for task in done:  # as `asyncio.run` says them: an error a task raised as it was canceled
            if not task.cancelled() and task.exception() is not None:
                loop.call_exception_handler({"message": "unhandled exception during asyncio.run() shutdown",
                                             "exception": task.exception(), "task": task})
        if pending:
            import io

            stacks = io.StringIO()
            for task in pending:
                print(f"{task!r:.300}", file=stacks)
                task.print_stack(file=stacks)
            raise AssertionError(f"tasks that did not end within {CLEANUP_WAIT:g} s of being canceled:\n{stacks.getvalue()}")
    runner.close()  # (nothing left to cancel) async generators, the default executor, the loop


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Whatever a test starts, it must be gone shortly after the test ends. If mpvisor leaves a
    process of the test running (a bug the test reports), kill it by pid after a short wait, so
    that later tests do not inherit it, and fail the test with its pids."""
    yield
    left = kill_leftovers(LEFTOVER_WAIT)
    _reap_ended_children()
    if left:
        pytest.fail(f"processes left running after the test (killed now): {left}")


def _reap_ended_children() -> None:
    """Reap the test process's children that ended unwaited: a test that failed before it waited
    for the processes it started (its `Popen`s) left them as zombies, which the next test's
    checks of the test process's children (`child_pids_of_self`: psutil lists zombies) took for
    its own, and failed on."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


@pytest.fixture(scope="session")
def installs():
    """Virtual environments `A` and `B` with mpvisor and two user packages installed the way users
    install them (editable and not, flat and src layouts; see tests/_venv.py), built once per
    session, from the moment the tests that need them were collected (tests/_prebuild.py). A
    venv that cannot be built fails the tests that use it, with pip's output."""
    return _prebuild.take("installs", _prebuild.build_installs)


# the fixtures whose builds start as soon as collection shows a test that needs them, by build
PREBUILT = {"installs": "installs", "tools_venv": "tools", "frozen_app": "frozen"}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the builds the collected tests need (tests/_prebuild.py), in the order they will
    first be needed."""
    if session.config.option.collectonly:
        return
    names: list[str] = []
    for item in session.items:
        for fixture in getattr(item, "fixturenames", ()):
            build = PREBUILT.get(fixture)
            if build == "frozen" and item.path.name != "test_frozen.py":
                continue  # test_frozen_others.py's `frozen_app`: its own freezers' builds
            if build is not None and build not in names:
                names.append(build)
    _prebuild.start(names)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _prebuild.finish()
    session.config.stash[_PASSED] = exitstatus == 0


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module marked `both_start_methods` runs each of its tests once per start method: the
    `supervised(...)` helper then serves its supervisor with that start method. Marked
    `both_start_methods(spawn="slow")`, its spawn runs are left to `-m slow` (a module whose
    tests decide in the parent what the start method does not change)."""
    marker = metafunc.definition.get_closest_marker("both_start_methods")
    if marker is not None:
        metafunc.fixturenames.append("each_start_method")
        methods = [pytest.param(method, marks=pytest.mark.slow) if marker.kwargs.get(method) == "slow" else method
                   for method in _support.START_METHODS]
        metafunc.parametrize("each_start_method", methods, indirect=True)


@pytest.fixture
def each_start_method(request):
    """The start method `supervised(...)` uses in this test (see `pytest_generate_tests`)."""
    _support.start_method_override = request.param
    yield request.param
    _support.start_method_override = None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The Ray tests (marked `ray`, or using the cluster) run in one process, in their own
    order, after the others of a run without xdist: the session's one Ray cluster starts at the
    first of them. Under xdist, a worker writes which tests must share a process
    (tests/_groups.py), as the tools venv's, the limits' and the docs' must too."""
    if hasattr(config, "workerinput") and os.environ.get(_prebuild.SHARED):
        from tests import _groups

        groups = {}
        for item in items:
            group = _groups.group_of(item.nodeid, getattr(item, "fixturenames", ()),
                                     item.get_closest_marker("ray") is not None)
            if group is not None:
                groups[item.nodeid] = group
        _groups.write(pathlib.Path(os.environ[_prebuild.SHARED]), groups, config.workerinput["workerid"])
    items.sort(key=_uses_ray)


@pytest.fixture(scope="session")
def postgres_server():
    """The session's throwaway PostgreSQL cluster (tests/_pg_support.py), started on first use."""
    from tests import _pg_support

    server = _pg_support.start_server()
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def ray_cluster():
    """The session's local Ray cluster (tests/_ray_support.py), started on first use, and stopped
    once the last test that uses it is done (`pytest_runtest_teardown`), or at the session's end."""
    from tests import _ray_support

    cluster = _ray_support.start_cluster()
    _ray_cluster.append(cluster)
    yield cluster
    _stop_ray()


_ray_cluster: list[object] = []  # the session's cluster, while it runs


def _stop_ray() -> None:
    from tests import _ray_support

    while _ray_cluster:
        _ray_support.stop_cluster(_ray_cluster.pop())


@pytest.hookimpl(trylast=True)  # after the test's own fixtures' teardown (`on_ray` looks at the cluster)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """The Ray tests run one after the other (last without xdist; under xdist first in the
    process that runs them, which then runs other tests): once the next test does not use the
    cluster, it goes, so that no later test of this process shares the machine with it nor sees
    its processes among its own. (No test that uses it comes after: it is not started again.)"""
    if _ray_cluster and _uses_ray(item) and (nextitem is None or not _uses_ray(nextitem)):
        _stop_ray()


def _uses_ray(item: pytest.Item) -> bool:
    """Whether the test uses the session's Ray cluster: marked `ray` (a parameter's mark, whose
    fixture asks for the cluster as it runs), or asking for it by name."""
    return item.get_closest_marker("ray") is not None or "ray_cluster" in getattr(item, "fixturenames", ())


@pytest.fixture
def on_ray(ray_cluster):
    """The Ray cluster, for one test; afterwards no fork server or attempt of mpvisor's may be
    left alive on it (killed, and the test failed, if one is)."""
    from tests import _ray_support
    from tests._support import wait_for

    yield ray_cluster
    try:
        wait_for(lambda: not _ray_support.mpvisor_leftovers(), timeout=LEFTOVER_WAIT + 5.0)
    except AssertionError:
        left = _ray_support.mpvisor_leftovers()
        _ray_support.kill_mpvisor_leftovers()
        pytest.fail(f"mpvisor processes left on the Ray cluster (killed now): {left}")

