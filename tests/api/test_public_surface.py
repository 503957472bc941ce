"""The public surface: every public API name is importable from `mpvisor` and `__all__` agrees;
every public name says `mpvisor`, is documented, and every error survives pickling."""

from __future__ import annotations

import collections.abc
import importlib.metadata
import inspect
import pickle
import subprocess
import sys
import traceback
import typing
from typing import Any

import pytest

import mpvisor

pytestmark = pytest.mark.timeout(60)

# The two names in `__all__` that are values, not classes or functions of mpvisor's own.
VALUES = {"TaskId": int, "INHERIT": mpvisor.INHERIT}

PUBLIC_API = {
    # inside an attempt; describing tasks; building and running; the handle; outcomes; errors;
    # events and subscribers; the controller; the blocking `run`
    "context", "TaskContext", "Canceled", "Fail", "Fatal",
    "TaskFn", "CommandTask", "TaskSpec", "RestartPolicy", "BackoffPolicy", "JitterPolicy",
    "TaskDefaults", "INHERIT", "SupervisorConfig", "Supervisor", "SupervisorBuilder",
    "SupervisorHandle", "TaskWaiter", "TaskInfo", "run",
    "TaskOutcome", "OutcomeKind", "RejectionKind",
    "MpvisorError", "ConfigError", "ShuttingDown", "AlreadyRunning", "TaskAlreadyExists",
    "CommandQueueFull", "TaskTerminationTimeout", "GraceExceeded", "ControllerError",
    "ControllerNotConfigured", "ControllerFull", "ControllerClosed", "AlreadySubmitted",
    "Event", "EventKind", "BackoffSource", "LogWriter", "JsonLinesWriter",
    "ControllerConfig", "ControllerSpec", "AdmissionPolicy", "PreparedSubmission",
    "ControllerSnapshot", "SlotView", "SlotStatus", "PrometheusMetrics", "TaskId", "Resources", "RestartIntensity", "Limits",
    "BlockingHandle", "BlockingWaiter", "BlockingEvents", "BlockingPreparedSubmission", "EventStream", "Subscriber",
    "freeze_support",
}
# Public submodules, imported only when asked for (`mpvisor.ray` imports Ray when served).
SUBMODULES = {"ray"}


def test_the_public_surface_matches_all():
    """Every name of the public API is importable, and `__all__` is exactly the public surface."""
    assert isinstance(mpvisor.__all__, tuple)
    assert len(set(mpvisor.__all__)) == len(mpvisor.__all__)
    assert set(mpvisor.__all__) >= PUBLIC_API
    for name in mpvisor.__all__:
        assert getattr(mpvisor, name) is not None, name
    public = {n for n in dir(mpvisor) if not n.startswith("_")} - {"annotations", "importlib", "TYPE_CHECKING", "Any"}
    assert public - SUBMODULES == set(mpvisor.__all__)


def test_the_ray_submodule_is_public_and_imports_no_ray():
    """`mpvisor.ray.RayLauncher` is public (says `mpvisor.ray`, documented); importing
    mpvisor, and mpvisor.ray itself, imports no Ray (a fresh interpreter tells)."""
    import subprocess
    import sys

    from mpvisor.ray import RayLauncher

    assert RayLauncher.__module__ == "mpvisor.ray" and RayLauncher.__doc__
    code = "import sys, mpvisor, mpvisor.ray; mpvisor.SupervisorConfig(launcher=mpvisor.ray.RayLauncher()); print('ray' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


def test_importing_mpvisor_is_light():
    """The launcher imports mpvisor before forking every attempt: the package must not pull in
    the parent-side runtime (asyncio, logging, threading) until it is used."""
    code = "import sys, mpvisor; print(' '.join(m for m in ('asyncio', 'logging', 'psutil') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": ":".join(p for p in sys.path if p)})
    assert out.stdout.strip() == ""


def _public_objects() -> list[tuple[str, Any]]:
    return [(n, getattr(mpvisor, n)) for n in mpvisor.__all__ if n not in VALUES]


def test_every_public_class_and_function_reports_module_mpvisor():
    """`help()`, reprs and tracebacks show `mpvisor.X`, never the private module behind it."""
    assert mpvisor.TaskId is int and repr(mpvisor.INHERIT) == "mpvisor.INHERIT"
    for name, obj in _public_objects():
        assert inspect.isclass(obj) or inspect.isfunction(obj), name
        assert (obj.__module__, obj.__qualname__) == ("mpvisor", name)
    shown = traceback.format_exception_only(mpvisor.ShuttingDown("closing"))
    assert shown == ["mpvisor.ShuttingDown: closing\n"]


def test_classes_loaded_by_the_runtime_report_mpvisor_before_they_are_named():
    """A class the caller only meets through another (the handle `serve()` returns) says `mpvisor`."""
    code = ("import mpvisor; mpvisor.Supervisor; import mpvisor._api.handle as h, mpvisor._tasks.registry as r; "
            "print(h.SupervisorHandle.__module__, r.TaskWaiter.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["mpvisor", "mpvisor"]


def _undocumented(cls: type) -> list[str]:
    missing = []
    for klass in cls.__mro__:
        if not klass.__module__.startswith("mpvisor"):
            continue
        for attr, member in vars(klass).items():
            raw = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
            documentable = inspect.isfunction(raw) or isinstance(raw, property)
            if not attr.startswith("_") and documentable and not (raw.__doc__ or "").strip():
                missing.append(f"{cls.__name__}.{attr}")
    return missing


def test_every_public_class_method_and_property_has_a_docstring():
    """`help(mpvisor.X)` says what each public class and each of its public members does."""
    undocumented = [name for name, obj in _public_objects() if not (obj.__doc__ or "").strip()]
    for _, obj in _public_objects():
        if inspect.isclass(obj):
            undocumented += _undocumented(obj)
    assert undocumented == []


def test_no_public_signature_has_a_private_parameter():
    """`help(mpvisor.X)` shows no `_`-prefixed parameter: no public function, class or method
    takes a back door (the CLI runs its work through `_api/session.py`, not through `run`)."""
    private = []
    for name, obj in _public_objects():
        members = [(name, obj)]
        if inspect.isclass(obj):
            members += [(f"{name}.{attr}", getattr(obj, attr)) for attr in dir(obj)
                        if not attr.startswith("_") or attr == "__init__"]
        for where, member in members:
            if not callable(member):
                continue
            try:
                parameters = inspect.signature(member).parameters
            except (TypeError, ValueError):
                continue  # a builtin without a signature
            private += [f"{where}({p})" for p in parameters if p.startswith("_")]
    assert private == []


def test_version_is_the_installed_distributions():
    """`mpvisor.__version__` is the version pip installed (one source: the package)."""
    assert mpvisor.__version__ == importlib.metadata.version("mpvisor")


ERRORS = [
    mpvisor.MpvisorError("x"), mpvisor.ConfigError("bad grace"), mpvisor.ShuttingDown("x"),
    mpvisor.AlreadyRunning("x"), mpvisor.TaskAlreadyExists("dup"), mpvisor.CommandQueueFull("x"),
    mpvisor.TaskTerminationTimeout(7, 1.5), mpvisor.GraceExceeded(2.0, ["a", "b"]),
    mpvisor.ControllerError("x"), mpvisor.ControllerNotConfigured(), mpvisor.ControllerFull("x"),
    mpvisor.ControllerClosed("x"), mpvisor.AlreadySubmitted("x"),
    mpvisor.Fail("flaky", exit_code=3), mpvisor.Fatal("broken"), mpvisor.Canceled(),
]


def test_every_error_class_is_covered_by_the_pickle_test():
    """The pickle test below covers every exception class of the public surface."""
    classes = {obj for _, obj in _public_objects() if inspect.isclass(obj) and issubclass(obj, BaseException)}
    assert classes == {type(error) for error in ERRORS}


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_errors_survive_a_pickle_round_trip(error):
    """An error pickles by its public name and comes back equal: message, fields and notes."""
    error.add_note("while testing")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert (copy.args, str(copy), vars(copy)) == (error.args, str(error), vars(error))


def test_the_blocking_handle_has_every_call_of_the_async_handle_typed():
    """BlockingHandle defines (not forwards) each public SupervisorHandle method, with the same
    parameters and a docstring, so `help()` and type checkers see the blocking API."""
    import inspect

    from mpvisor._api.blocking import BlockingHandle

    for name, method in inspect.getmembers(mpvisor.SupervisorHandle, inspect.isfunction):
        if name.startswith("_"):
            continue
        blocking = BlockingHandle.__dict__.get(name)
        assert blocking is not None, f"BlockingHandle lacks {name}"
        assert list(inspect.signature(blocking).parameters) == list(inspect.signature(method).parameters), name
        assert blocking.__doc__, name


def test_the_runtime_imports_without_collections_and_leaves_the_collector_as_it_was():
    """The first public name that loads the parent's modules (and `mpvisor.run`'s own import of
    the runtime) runs no collection while it imports; the collector is on again after it if it
    was on, off if the program had turned it off."""
    code = """
import gc, sys
import mpvisor
modules_at_collections = []
gc.callbacks.append(lambda phase, info: modules_at_collections.append(len(sys.modules)) if phase == "start" else None)
gc.collect(); modules_at_collections.clear()
before = len(sys.modules)
from mpvisor import Supervisor, TaskSpec
after = len(sys.modules)
assert "asyncio" in sys.modules and "mpvisor._runtime.runtime" in sys.modules
print(gc.isenabled(), after - before > 100, [n for n in modules_at_collections if n != after])
gc.disable()
from mpvisor import run, Event
print(gc.isenabled())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split("\n")[:2] == ["True True []", "False"]


def test_an_events_enum_fields_are_typed_as_their_enums():
    """`event.outcome_kind`, `.rejection_kind` and `.backoff_source` were typed `object`, so a
    subscriber checked with `mypy --strict` could not write `event.outcome_kind.label` (the
    events guide's own example): `"object" has no attribute "label"`. They are typed as the
    enums they hold, which the annotations resolve to."""
    names = {"OutcomeKind": mpvisor.OutcomeKind, "RejectionKind": mpvisor.RejectionKind,
             "BackoffSource": mpvisor.BackoffSource}
    hints = typing.get_type_hints(mpvisor.Event, localns=names)
    assert hints["outcome_kind"] == mpvisor.OutcomeKind | None
    assert hints["rejection_kind"] == mpvisor.RejectionKind | None
    assert hints["backoff_source"] == mpvisor.BackoffSource | None


def _mpvisor_classes(annotation: Any) -> set[type]:
    """The classes of mpvisor's own that a resolved annotation names, however nested."""
    found = {annotation} if isinstance(annotation, type) and annotation.__module__.startswith("mpvisor") else set()
    for argument in typing.get_args(annotation):
        found |= _mpvisor_classes(argument)
    return found


def test_every_object_the_api_hands_out_has_a_public_name():
    """A program checked with `mypy --strict` annotates what it keeps: `serve_blocking()` gave a
    `BlockingHandle`, its waiters, event iterator and prepared submissions, and `events()` an
    `EventStream`, none of them named in `mpvisor` (only a private module's import could name
    them), nor the `Subscriber` protocol that `subscribers=` takes. Every class reached from
    `Supervisor`, `SupervisorHandle` and `run` through what a public method returns, and the
    subscriber's type, is now a public name."""
    namespace = {**vars(collections.abc), **vars(typing), **{n: getattr(mpvisor, n) for n in mpvisor.__all__}}
    seen: set[type] = set()
    todo: list[type] = [mpvisor.Supervisor, mpvisor.SupervisorHandle]
    todo += _mpvisor_classes(typing.get_type_hints(mpvisor.run, localns=namespace)["return"])
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for attr in dir(cls):
            member = inspect.getattr_static(cls, attr)
            raw = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
            raw = raw.fget if isinstance(raw, property) else raw
            if attr.startswith("_") or not inspect.isfunction(raw):
                continue
            todo += _mpvisor_classes(typing.get_type_hints(raw, localns=namespace).get("return"))
    subscriber = typing.get_type_hints(mpvisor.run, localns=namespace)["subscribers"]
    seen |= _mpvisor_classes(subscriber)
    hidden = sorted(f"{c.__module__}.{c.__qualname__}" for c in seen if getattr(mpvisor, c.__name__, None) is not c)
    assert hidden == []
    assert {"BlockingHandle", "BlockingWaiter", "EventStream", "Subscriber"} <= {c.__name__ for c in seen}


def test_the_batch_calls_are_typed_for_any_iterable_of_specs():
    """`mpvisor.run(spec for ...)` and `Supervisor().run(...)` take any iterable of specs (a
    generator runs), but were typed `Sequence[TaskSpec]`, so `mypy --strict` refused the
    generator a program passed them. They are typed `Iterable[TaskSpec]`, as they behave."""
    names = {n: getattr(mpvisor, n) for n in mpvisor.__all__}
    for call in (mpvisor.run, mpvisor.Supervisor.run):
        assert typing.get_type_hints(call, localns=names)["specs"] == collections.abc.Iterable[mpvisor.TaskSpec], call


def test_every_module_imported_by_name_is_imported_where_a_freezer_sees_it():
    """Each module `mpvisor.__getattr__` imports by name is imported in `_imported_by_name`: a
    freezer that puts in a program only what it sees imported where code can run (Nuitka) finds
    it there."""
    import ast

    tree = ast.parse(inspect.getsource(mpvisor._imported_by_name))
    named = {f"{node.module}.{alias.name}" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             for alias in node.names}
    assert {"mpvisor" + module for module in mpvisor._LAZY.values()} <= named
