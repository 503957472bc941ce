"""The msgpack value model and the two task descriptions, checked without any process."""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import sys
import types
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpvisor._model.payloads import INT_MAX, INT_MIN, MAX_DEPTH, check_value
from mpvisor._model.work import CommandTask, TaskFn, target_path

pytestmark = pytest.mark.unit


def module_level_target(x: int) -> int:
    """A target reachable as `tests.test_values_and_tasks:module_level_target`."""
    return x


class Holder:
    """A class whose methods are used as targets."""

    def method(self) -> None:
        """An instance method."""

    @classmethod
    def class_method(cls) -> None:
        """A class method."""

    @staticmethod
    def static_method() -> None:
        """A static method."""


# --- values --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        INT_MIN,
        INT_MAX,
        1.5,
        float("nan"),
        "text",
        b"\x00bytes",
        [1, "a", b"b"],
        (1, (2, (3,))),
        {"k": {b"k": [None, {"deep": 1.0}]}},
        {},
        [],
    ],
)
def test_msgpack_values_are_accepted(value: object) -> None:
    """None, bool, int in range, float, str, bytes, list, tuple and dict nest freely."""
    check_value(value, "args[0]")
    assert TaskFn("t", "m:f", args=[value], kwargs={"v": value}).args[0] is value


@pytest.mark.parametrize(
    ("value", "where", "named"),
    [
        (object(), "args[0]", "args[0]"),
        ({1, 2}, "kwargs['x']", "kwargs['x']"),
        (2**64, "args[1]", "args[1]"),
        (INT_MIN - 1, "args[0]", "args[0]"),
        ({1: "a"}, "args[0]", "args[0]"),
        (bytearray(b"x"), "args[0]", "args[0]"),
        ([0, 1, {"k": {3}}], "args[0]", "args[0][2]['k']"),
        ({"a": [1, 2, object()]}, "kwargs['y']", "kwargs['y']['a'][2]"),
    ],
)
def test_non_msgpack_values_raise_type_error_naming_where(
    value: object, where: str, named: str
) -> None:
    """A set, an object, an out-of-range int or a dict with int keys is refused by path."""
    with pytest.raises(TypeError) as caught:
        check_value(value, where)
    assert named in str(caught.value)


def test_the_refusal_names_the_offending_type() -> None:
    """The message names the type of the refused value."""
    with pytest.raises(TypeError, match=r"args\[0\]\[1\].*set"):
        check_value([1, {2}], "args[0]")


def _reference_check(value: object, where: str) -> None:
    """The plain walk `check_value` shortcuts: every item with its path, checked one by one."""
    stack: list[tuple[object, str]] = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, (type(None), bool, float, str, bytes)):
            continue
        if isinstance(item, int):
            if not INT_MIN <= item <= INT_MAX:
                raise TypeError(f"{path} is an int out of msgpack's range")
        elif isinstance(item, (list, tuple)):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))
        elif isinstance(item, dict):
            for key in item:
                if not isinstance(key, (str, bytes)):
                    raise TypeError(f"{path} has a key that is not str or bytes")
            stack.extend((child, f"{path}[{key!r}]") for key, child in item.items())
        else:
            raise TypeError(f"{path} is not a msgpack value")


class _Int(int):
    """An int subclass (as an IntEnum member is): accepted, through the general path."""


_leaves = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False), st.text(max_size=3), st.binary(max_size=3),
                    st.integers(INT_MIN - 2, INT_MAX + 2), st.integers(-5, 5).map(_Int),
                    st.sampled_from([{1}, bytearray(b"x"), object(), 1 + 2j]))
_values = st.recursive(_leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.lists(inner, max_size=3).map(tuple),
    st.dictionaries(st.one_of(st.text(max_size=2), st.binary(max_size=2), st.integers(0, 3)), inner, max_size=4)),
    max_leaves=25)


@settings(max_examples=400, deadline=None)
@given(_values)
def test_the_check_accepts_and_refuses_as_the_plain_walk_and_names_the_same_place(value: object) -> None:
    """Plain items of a container are accepted where they are met, without a path (a list of a
    million numbers took 1.5 s to check): the same values pass, and a refusal names the same place."""
    try:
        _reference_check(value, "args[0]")
    except TypeError as expected:
        with pytest.raises(TypeError) as raised:
            check_value(value, "args[0]")
        where = str(expected).split(" is ")[0].split(" has ")[0]
        assert str(raised.value).startswith(where + " "), (str(raised.value), str(expected))
    else:
        check_value(value, "args[0]")


def test_deep_nesting_gives_type_error_not_recursion_error() -> None:
    """A value nested deeper than msgpack can pack is a TypeError, whatever the depth."""
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(TypeError, match="nested deeper") as raised:
        check_value(deep, "args[0]")
    assert str(raised.value).startswith("args[0][0]") and len(str(raised.value)) < 160, raised.value  # not a 500-step path


def test_nesting_up_to_the_limit_is_accepted() -> None:
    """A value exactly at msgpack's nesting limit is still a msgpack value."""
    deep: list[Any] = []
    for _ in range(MAX_DEPTH - 1):
        deep = [deep]
    assert TaskFn("t", "m:f", args=[deep]).args == (deep,)


def test_a_self_containing_value_is_refused() -> None:
    """A list that contains itself is refused with a TypeError, not an endless walk."""
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(TypeError, match=r"args\[0\]"):
        check_value(loop, "args[0]")


# --- TaskFn --------------------------------------------------------------------------------


def test_a_callable_target_is_recorded_as_module_and_qualname() -> None:
    """A module-level callable is recorded as `module:qualname`."""
    task = TaskFn("t", module_level_target, args=[1], kwargs={"x": 2})
    assert task.target == f"{__name__}:module_level_target"
    assert task.args == (1,)
    assert task.kwargs == {"x": 2}


def test_class_and_static_methods_are_recorded_by_qualname() -> None:
    """Class methods and static methods are reachable as `module:Class.method`."""
    assert target_path(Holder.class_method) == f"{__name__}:Holder.class_method"
    assert target_path(Holder.static_method) == f"{__name__}:Holder.static_method"
    assert target_path(Holder) == f"{__name__}:Holder"


class HoldersChild(Holder):
    """A class that inherits `Holder.class_method`."""


def test_an_inherited_class_method_is_recorded_through_the_class_it_was_taken_from() -> None:
    """`HoldersChild.class_method`, defined on `Holder`: its qualname says `Holder.class_method`,
    which is `Holder`'s method, not the child's, so it was refused (`not reachable as ...`) and
    the error did not say what to give. It is reached through the class it was taken from, and
    the attempt calls it with that class."""
    assert target_path(HoldersChild.class_method) == f"{__name__}:HoldersChild.class_method"
    assert target_path(Holder.class_method) == f"{__name__}:Holder.class_method"


def test_a_method_of_a_built_in_type_is_refused_saying_what_to_give() -> None:
    """`str.upper` (a method descriptor: it takes its object as first argument) was refused as
    `a callable object bound to a module-level name can be given as 'module:name'`, which it is
    not; the error now names what it is and what to give."""
    with pytest.raises(TypeError) as caught:
        TaskFn("t", str.upper)
    assert str(caught.value) == ("target cannot be a method of a built-in object or type, got <method 'upper' of "
                                 "'str' objects>: an attempt imports its target by name; make it a module-level "
                                 "function that calls the method"), caught.value


def test_a_module_level_builtin_is_reachable() -> None:
    """A built-in function of a module is recorded with that module."""
    assert target_path(len) == "builtins:len"


def test_a_target_defined_in_main_is_recorded_as_main(monkeypatch: pytest.MonkeyPatch) -> None:
    """A callable defined in `__main__` is recorded as `__main__:qualname`."""
    main = types.ModuleType("__main__")
    exec("def job():\n    return 1\n", main.__dict__)
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert TaskFn("m", main.job).target == "__main__:job"


@pytest.mark.parametrize(
    "target", ["pkg.mod:func", "m:f", "a.b.c:Cls.method", "_private._mod:_f", "modülé:fünc"]
)
def test_well_formed_target_strings_are_kept(target: str) -> None:
    """A `package.module:attr` string of dotted identifiers is accepted as given."""
    assert TaskFn("t", target).target == target


@pytest.mark.parametrize(
    "target",
    [
        "",
        "module",
        "mod:",
        ":func",
        "a:b:c",
        "pkg..mod:f",
        "pkg.mod:f()",
        "1mod:f",
        "mod:f-g",
        " m:f",
    ],
)
def test_malformed_target_strings_are_refused_naming_target_and_value(target: str) -> None:
    """A target string not of the form `package.module:attr` is a ValueError."""
    with pytest.raises(ValueError) as caught:
        TaskFn("t", target)
    assert "target" in str(caught.value)
    assert repr(target) in str(caught.value)


@pytest.mark.parametrize(("target", "meant"), [("jobs/nightly.py:run", "jobs.nightly:run"), ("./jobs.py:run", "jobs:run"),
                                               ("jobs/nightly:run", "jobs.nightly:run")])
def test_a_target_given_as_a_files_path_is_told_the_module_name_it_meant(target: str, meant: str) -> None:
    """`mpvisor run jobs/nightly.py:run` (or `TaskFn`, or a task file's `target`) said only that
    the form is wrong; it now also says the module's name, as import takes it."""
    with pytest.raises(ValueError) as caught:
        TaskFn("t", target)
    assert str(caught.value).endswith(f"got {target!r} (a file's path? a target names its module, as import does: "
                                      f"{meant!r})"), caught.value
    with pytest.raises(ValueError) as other:
        TaskFn("t", "a:b:c")
    assert "file's path" not in str(other.value)


def generator_target(n: int) -> Any:
    """A generator function at module level."""
    yield from range(n)


async def async_generator_target() -> Any:
    """An async generator function at module level."""
    yield 1


def _nested_function() -> Any:
    def inner() -> None:
        """A nested function."""

    return inner


@pytest.mark.parametrize(
    ("target", "error"),
    [
        (lambda: None, ValueError),
        (_nested_function(), ValueError),
        (Holder().method, TypeError),
        (functools.partial(module_level_target, 1), TypeError),
        ([].append, TypeError),
        (object(), TypeError),
        (42, TypeError),
    ],
    ids=["lambda", "nested", "bound-method", "partial", "builtin-method", "object", "int"],
)
def test_unreachable_callable_targets_are_refused(target: object, error: type[Exception]) -> None:
    """A lambda, nested function, bound method or partial is refused naming target."""
    with pytest.raises(error) as caught:
        TaskFn("t", target)  # type: ignore[arg-type]
    assert "target" in str(caught.value)


def test_a_partial_or_a_bound_method_is_refused_saying_what_to_give_instead() -> None:
    """`functools.partial(f, 1, scale=2)` and `obj.method`, as a pool's `map` takes them, were
    refused saying only `(pass args instead)` and nothing at all: the errors now say why (a
    target is imported by name) and what to give instead, naming the partial's function, its
    arguments and its keywords."""
    with pytest.raises(TypeError) as caught:
        TaskFn("t", functools.partial(module_level_target, 1, scale=2))
    assert str(caught.value).endswith(
        f": an attempt imports its target by name, which a partial has not; give its function, "
        f"'{__name__}:module_level_target', as the target, with the partial's arguments, (1,), first in args and its "
        f"keywords, {{'scale': 2}}, in kwargs"), caught.value
    with pytest.raises(TypeError) as caught:
        TaskFn("t", Holder().method)
    assert str(caught.value).startswith("target cannot be a method bound to an instance, got <bound method "), caught.value
    assert str(caught.value).endswith(
        ": an attempt imports its target by name, and no instance goes with it; make it a module-level function "
        "(or a staticmethod) that takes what it needs of the instance as arguments"), caught.value


@pytest.mark.parametrize(("target", "kind"), [(generator_target, "a generator"),
                                            (async_generator_target, "an async generator")])
def test_a_generator_function_target_is_refused_when_the_task_is_built(target: object, kind: str) -> None:
    """A generator function ran in an attempt without running a line of its body, and the attempt
    ended FATAL on what it returned (`the result of type generator cannot be sent`): it is
    refused when the `TaskFn` is built, saying why and what to return instead (in words: it said
    `the a generator it returns`)."""
    noun = kind.split(" ", 1)[1]
    with pytest.raises(TypeError, match=f"^target cannot be {kind} function: calling it runs none of its body, "
                                        f"and the {noun} it returns cannot be sent back"):
        TaskFn("t", target)  # type: ignore[arg-type]


module_level_lambda = lambda: None  # noqa: E731 (the case: a lambda bound at module level)


def test_a_lambda_bound_at_module_level_is_refused_saying_how_to_give_it() -> None:
    """`square = lambda x: ...` at module level is refused (its qualified name, `<lambda>`, leads
    nowhere), and the error said only `must be defined at module level`, which it seemed to be:
    it now says why, and that `'module:name'` reaches it."""
    with pytest.raises(ValueError) as caught:
        TaskFn("t", module_level_lambda)
    message = str(caught.value)
    assert "qualified name, '<lambda>', which no module has" in message
    assert "can be given as 'module:name'" in message


class CallableObject:
    def __call__(self) -> str:
        return "called"


module_level_instance = CallableObject()


def test_a_callable_object_is_refused_saying_how_to_give_it() -> None:
    """An instance with `__call__` has no `module:qualname` of its own: refused, saying that the
    module-level name it is bound to reaches it."""
    with pytest.raises(TypeError, match=r"an instance of CallableObject: a callable object bound to a module-level "
                                        r"name can be given as 'module:name'"):
        TaskFn("t", module_level_instance)


def test_a_callable_whose_name_leads_elsewhere_is_refused() -> None:
    """A callable whose `module:qualname` resolves to another object cannot be imported back."""

    def impostor() -> None:
        """Pretends to be `module_level_target`."""

    impostor.__qualname__ = "module_level_target"
    with pytest.raises(ValueError, match="not reachable"):
        TaskFn("t", impostor)


@pytest.mark.parametrize(("name", "error"), [("", ValueError), (None, TypeError), (3, TypeError), ("a\nb", ValueError),
                                             ("tab\there", ValueError), ("a\u2028b", ValueError), ("\ud800", ValueError)])
def test_task_names_must_be_non_empty_printable_strings(name: object, error: type[Exception]) -> None:
    """An empty, non-string or unprintable task name (a control character, a line or paragraph
    separator, a lone surrogate: it would break the one line it is printed on) is refused naming
    the field and value; any printable text is a name."""
    with pytest.raises(error) as caught:
        TaskFn(name, "m:f")  # type: ignore[arg-type]
    assert "name" in str(caught.value)
    assert repr(name) in str(caught.value)
    with pytest.raises(error):
        CommandTask(name, ["true"])  # type: ignore[arg-type]
    assert TaskFn("nightly café 2", "m:f").name == "nightly café 2"


@pytest.mark.parametrize(
    ("args", "kwargs", "named"),
    [
        ((object(),), None, "args[0]"),
        ((1, {2}), None, "args[1]"),
        ((), {"x": {1, 2}}, "kwargs['x']"),
        ((), {"d": {1: "a"}}, "kwargs['d']"),
        ((2**64,), None, "args[0]"),
        (([0, 1, {"k": object()}],), None, "args[0][2]['k']"),
    ],
)
def test_task_arguments_must_be_msgpack(
    args: tuple[Any, ...], kwargs: dict[str, Any] | None, named: str
) -> None:
    """A non-msgpack argument raises TypeError naming it when the task is defined."""
    with pytest.raises(TypeError) as caught:
        TaskFn("t", "m:f", args=args, kwargs=kwargs)
    assert named in str(caught.value)


def test_keyword_argument_names_must_be_strings() -> None:
    """Keyword argument names are str, never bytes or ints."""
    with pytest.raises(TypeError, match="kwargs keys"):
        TaskFn("t", "m:f", kwargs={b"x": 1})  # type: ignore[dict-item]


def test_task_fn_copies_its_arguments_and_is_frozen() -> None:
    """A TaskFn keeps its own tuple of args and copy of kwargs, and cannot be changed."""
    kwargs = {"a": 1}
    task = TaskFn("t", "m:f", args=[1, 2], kwargs=kwargs)
    kwargs["a"] = 2
    assert task.args == (1, 2)
    assert task.kwargs == {"a": 1}
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.name = "u"  # type: ignore[misc]
    assert task == TaskFn("t", "m:f", args=(1, 2), kwargs={"a": 1})
    assert repr(task) == "TaskFn('t', 'm:f', args=(1, 2), kwargs={'a': 1})"


# --- CommandTask ---------------------------------------------------------------------------


def test_command_task_stores_argv_env_and_cwd() -> None:
    """A CommandTask keeps argv as a tuple, env as a dict and cwd as a str."""
    task = CommandTask(
        "c", ["sh", "-c", "exit 0"], env={"A": "1", "HOME": None}, cwd=pathlib.Path("/tmp")
    )
    assert task.argv == ("sh", "-c", "exit 0")
    assert task.env == {"A": "1", "HOME": None}
    assert task.cwd == "/tmp"
    assert "CommandTask('c', ['sh', '-c', 'exit 0']" in repr(task)


def test_a_commands_program_and_arguments_may_be_paths_as_subprocess_takes_them() -> None:
    """`CommandTask("a", [Path("/bin/echo"), Path("x")])` was refused (`argv[0] must be a str`),
    where its `cwd` and `subprocess` take a path: each is its text; a bytes path is still refused."""
    task = CommandTask("a", [pathlib.Path("/bin/echo"), "-n", pathlib.Path("rel/x")])
    assert task.argv == ("/bin/echo", "-n", "rel/x")
    with pytest.raises(TypeError, match=r"argv\[0\] must be a str \(or a path\), got b'/bin/echo'"):
        CommandTask("a", [b"/bin/echo"])  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("kwargs", "error", "named"),
    [
        ({"argv": []}, TypeError, "argv"),
        ({"argv": "sh -c true"}, TypeError, "argv"),
        ({"argv": ["sh", 3]}, TypeError, "argv[1]"),
        ({"argv": [""]}, ValueError, "argv[0]"),
        ({"argv": ["sh", "a\0b"]}, ValueError, "argv[1]"),
        ({"argv": ["sh"], "env": {"A": 1}}, TypeError, "env['A']"),
        ({"argv": ["sh"], "env": {"A=B": "1"}}, ValueError, "env"),
        ({"argv": ["sh"], "env": [("A", "1")]}, TypeError, "env"),
        ({"argv": ["sh"], "cwd": 3}, TypeError, "cwd"),
        ({"argv": ["sh"], "cwd": b"/tmp"}, TypeError, "cwd"),
        # what the system cannot be given: a NUL, a lone surrogate that stands for no byte
        ({"argv": ["sh"], "cwd": "/tmp/a\0b"}, ValueError, "cwd"),
        ({"argv": ["sh"], "cwd": "/tmp/\ud800"}, ValueError, "cwd"),
        ({"argv": ["sh", "\ud800"]}, ValueError, "argv[1]"),
        ({"argv": ["sh"], "env": {"A": "\udfff"}}, ValueError, "env['A']"),
        ({"argv": ["sh"], "env": {"\ud800": "1"}}, ValueError, "env key"),
    ],
)
def test_invalid_command_tasks_are_refused(
    kwargs: dict[str, Any], error: type[Exception], named: str
) -> None:
    """A bad argv, env or cwd is refused at once naming the field, by a TaskFn too (its env
    and cwd)."""
    with pytest.raises(error) as caught:
        CommandTask("c", **kwargs)
    assert named in str(caught.value)
    if set(kwargs) - {"argv"}:
        with pytest.raises(error) as caught:
            TaskFn("t", "workers.basic:quick", **{k: v for k, v in kwargs.items() if k != "argv"})
        assert named in str(caught.value)


def test_bytes_that_are_not_utf_8_pass_in_argv_env_and_cwd() -> None:
    """A byte that is not UTF-8, as `os.fsdecode` gives it (`\\udce9`), is kept: it reaches
    the program as that byte."""
    task = CommandTask("c", ["ls", "caf\udce9"], env={"F\udce9": "caf\udce9"}, cwd="/tmp/caf\udce9")
    assert (task.argv[1], task.env, task.cwd) == ("caf\udce9", {"F\udce9": "caf\udce9"}, "/tmp/caf\udce9")


def test_the_script_an_attempt_imported_as_mp_main_is_recorded_as_main(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside an attempt the script is `__mp_main__`, aliased as `__main__`: a target string naming
    it is recorded as `__main__:name`, as a callable of it is (what a nested run's child imports);
    a `__mp_main__` that is not the script is left alone."""
    script = types.ModuleType("__mp_main__")
    monkeypatch.setitem(sys.modules, "__mp_main__", script)
    assert target_path("__mp_main__:job") == "__mp_main__:job"
    monkeypatch.setitem(sys.modules, "__main__", script)
    assert target_path("__mp_main__:job") == "__main__:job"
    assert TaskFn("t", "__mp_main__:job").target == "__main__:job"
