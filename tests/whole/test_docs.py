"""Is what README.md and the guide (docs/*.md) say true?

Every fenced code block is executed, each in a fresh temporary directory outside the
repository, with the repository root on `PYTHONPATH` (so the `workers.*` targets the examples
name import), the interpreter running these tests first on `PATH` (so `python` and `mpvisor`
are the installed ones) and a private slot-server directory (`MPVISOR_SLOTS_DIR`). A block's
info string says how it is run:

| info string | run as | passes when |
|---|---|---|
| `python` | `python example.py` | it exits 0 |
| `bash` | `bash -euo pipefail example.sh` | it exits 0 |
| `console` | each `$ ` line with `bash -o pipefail -c`, one after another in one directory | each exits 0 and prints (stdout and stderr together) exactly the lines shown under it |
| `toml` | a task file: `mpvisor check example.toml` | it exits 0 |
| `text` | not run: a diagram, a layout, or output | - |
| `text output` | not run: what the block above it prints | the block above's stdout is exactly this, and it wrote nothing on stderr |
| `... ray` (attribute) | as its language says, on the session's Ray cluster (`-m ray`, with `RAY_ADDRESS`) | as its language says |
| `... no-run` (attribute) | not run (any language but `text`: also one these tests cannot run, such as `yaml`) | the line above the fence is `<!-- no-run: <the reason> -->` |

So a block that is not run says why, in the file, where a reader of the source sees it. One
block is run by its own rule: the README's first block is the project's two set-up commands,
which CI depends on word for word. It is pinned here, and of its commands the one that is not an
install into this interpreter and not this very suite, `python scripts/demo.py`, is run from the
repository root (installing the way it says is what `tests/whole/test_installs.py` does, in real
virtual environments).

Besides running the blocks: every relative link of README.md and docs/*.md must reach a file
(and a heading, for `#anchor`s into Markdown); every page of the guide is linked from its index;
the configuration reference states the real defaults of every setting; the CLI reference
documents every option of the real parsers and nothing else; the outcome, rejection and event
tables list every kind with its real label.

The local blocks run concurrently (a small thread pool, once per session) and each is then one
test; the Ray blocks run on the session cluster, after every other test.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import enum
import functools
import inspect
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import mpvisor
from mpvisor._admission.leases import local as _leases
from mpvisor._cli import main as _cli
from mpvisor._cli import statuses
from mpvisor.ray import RayLauncher
from tests import _markdown
from tests._slot_support import stop_servers

pytestmark = pytest.mark.timeout(120)

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(GUIDE.glob("*.md"))]
LANGUAGES = {"python", "bash", "console", "toml", "text"}
RUNNABLE = {"python", "bash", "console", "toml"}
ATTRIBUTES = {"output", "ray", "no-run"}
NO_RUN_REASON = re.compile(r"^<!-- no-run: (?P<reason>\S.*?) -->$")
BLOCK_TIMEOUT = 60.0  # seconds: a block is meant to take one or two
WORKERS = 3  # blocks run at once (they mostly wait for child processes)
SET_UP = (
    "pip install . && python scripts/demo.py                              # install, then a few-second tour on an embedded default\n"
    "pip install '.[test,prometheus,ray,postgres]' && python -m pytest    # install the test extras, run the whole suite\n"
)
DEMO = "python scripts/demo.py"


def relative(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix()


@dataclasses.dataclass(frozen=True)
class Example:
    """A block of a page, and the block just before it on that page (for `text output`)."""

    page: pathlib.Path
    block: _markdown.Block
    previous: _markdown.Block | None

    @property
    def id(self) -> str:
        return f"{relative(self.page)}:{self.block.line}"

    @property
    def is_set_up(self) -> bool:
        return self.page.name == "README.md" and self.page.parent == ROOT and self.previous is None

    @property
    def runs(self) -> bool:
        return self.block.lang in RUNNABLE and "no-run" not in self.block.attrs and not self.is_set_up


def examples() -> list[Example]:
    found: list[Example] = []
    for page in PAGES:
        previous: _markdown.Block | None = None
        for block in _markdown.blocks(page.read_text(encoding="utf-8")):
            found.append(Example(page, block, previous))
            previous = block
    return found


EXAMPLES = examples()
LOCAL = [e for e in EXAMPLES if e.runs and "ray" not in e.block.attrs]
ON_RAY = [e for e in EXAMPLES if e.runs and "ray" in e.block.attrs]
OUTPUTS = [e for e in EXAMPLES if e.block.lang == "text" and "output" in e.block.attrs]


def output_after(example: Example) -> Example | None:
    """The `text output` block right after `example`, if there is one."""
    return next((e for e in OUTPUTS if e.page == example.page and e.previous == example.block), None)


# --- running a block -----------------------------------------------------------------------------


@dataclasses.dataclass
class Ran:
    """What running a block did: `problems` is empty when it passed; `stdout` and `stderr` are
    what a python or bash block printed (for the `text output` block after it)."""

    problems: list[str]
    stdout: str = ""
    stderr: str = ""


def environment(directory: pathlib.Path, ray_address: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH", _leases.DIR_ENV)}
    bins = [os.path.dirname(sys.executable)]
    executable = shutil.which("mpvisor")
    assert executable is not None, "the mpvisor executable is not on PATH"
    bins.append(os.path.dirname(executable))
    env["PATH"] = os.pathsep.join([*dict.fromkeys(bins), env.get("PATH", "")])
    env["PYTHONPATH"] = str(ROOT)
    env["PYTHONUNBUFFERED"] = "1"  # the parent's and the attempts' lines interleave as on a terminal
    env[_leases.DIR_ENV] = str(directory / ".slots")
    if ray_address is not None:
        env["RAY_ADDRESS"] = ray_address
    return env


def _completed(argv: list[str], directory: pathlib.Path, env: dict[str, str], merge: bool = False) -> subprocess.CompletedProcess[str]:
    """Run `argv` to its end; with `merge`, its stderr goes where its stdout goes (as on a terminal)."""
    return subprocess.run(argv, cwd=directory, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT if merge else subprocess.PIPE, text=True, timeout=BLOCK_TIMEOUT)


def _failed(what: str, done: subprocess.CompletedProcess[str]) -> str:
    return f"{what} exited {done.returncode}\n--- stdout ---\n{done.stdout}--- stderr ---\n{done.stderr or ''}"


def run_block(block: _markdown.Block, ray_address: str | None = None) -> Ran:
    """Run one block in a fresh directory, as the module table says."""
    with tempfile.TemporaryDirectory(prefix="mpvisor-docs-") as name:
        directory = pathlib.Path(name)
        env = environment(directory, ray_address)
        try:
            return _run_in(block, directory, env)
        except subprocess.TimeoutExpired as exc:
            return Ran([f"did not finish within {BLOCK_TIMEOUT:g} s: {exc.cmd!r}"])
        finally:
            stop_servers(directory / ".slots")


def _run_in(block: _markdown.Block, directory: pathlib.Path, env: dict[str, str]) -> Ran:
    if block.lang == "python":
        (directory / "example.py").write_text(block.text, encoding="utf-8")
        done = _completed([sys.executable, "example.py"], directory, env)
        return Ran([] if done.returncode == 0 else [_failed("python example.py", done)], done.stdout, done.stderr)
    if block.lang == "bash":
        (directory / "example.sh").write_text(block.text, encoding="utf-8")
        done = _completed(["bash", "-euo", "pipefail", "example.sh"], directory, env)
        return Ran([] if done.returncode == 0 else [_failed("bash -euo pipefail example.sh", done)], done.stdout,
                   done.stderr)
    if block.lang == "toml":
        (directory / "example.toml").write_text(block.text, encoding="utf-8")
        done = _completed(["mpvisor", "check", "example.toml"], directory, env)
        return Ran([] if done.returncode == 0 else [_failed("mpvisor check example.toml", done)])
    assert block.lang == "console", block.lang
    problems: list[str] = []
    for command, shown in _markdown.console_steps(block.text):
        done = _completed(["bash", "-o", "pipefail", "-c", command], directory, env, merge=True)
        printed = "".join(f"{line.rstrip()}\n" for line in done.stdout.splitlines())
        if done.returncode != 0:
            problems.append(f"$ {command}\nexited {done.returncode} (a transcript shows a status with `|| echo ...`); printed:\n{printed}")
        elif printed != shown:
            problems.append(f"$ {command}\nprinted:\n{printed}--- but the block shows ---\n{shown}")
    return Ran(problems)


def run_set_up() -> Ran:
    """The set-up block's demo, from the repository root, as a new checkout runs it."""
    with tempfile.TemporaryDirectory(prefix="mpvisor-docs-") as name:
        env = environment(pathlib.Path(name))
        del env["PYTHONPATH"]  # the demo finds `workers/` from the checkout it is in
        try:
            done = _completed(DEMO.split(), ROOT, env)
        except subprocess.TimeoutExpired:
            return Ran([f"{DEMO} did not finish within {BLOCK_TIMEOUT:g} s"])
        return Ran([] if done.returncode == 0 else [_failed(DEMO, done)])


@pytest.fixture(scope="module")
def ran() -> Iterator[dict[str, Ran]]:
    """Every local block (and the set-up block's demo), run concurrently, by example id."""
    jobs: dict[str, Callable[[], Ran]] = {e.id: functools.partial(run_block, e.block) for e in LOCAL}
    jobs.update({e.id: run_set_up for e in EXAMPLES if e.is_set_up})
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        futures = {key: pool.submit(job) for key, job in jobs.items()}
        yield {key: future.result() for key, future in futures.items()}


def _ran_above(ran: dict[str, Ran], example: Example) -> Ran:
    assert example.previous is not None
    key = f"{relative(example.page)}:{example.previous.line}"
    assert key in ran, f"{example.id}: a `text output` block must follow a python or bash block that runs"
    return ran[key]


# --- the blocks ------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=relative)
def test_every_block_says_how_it_is_run(page: pathlib.Path) -> None:
    """A block names a known language; `output` follows a python or bash block; `ray` is on a
    runnable block; a `no-run` block states its reason in the comment above it."""
    problems: list[str] = []
    for example in (e for e in EXAMPLES if e.page == page):
        block, where = example.block, example.id
        if block.lang not in LANGUAGES and not (block.lang and "no-run" in block.attrs):
            problems.append(f"{where}: info string {block.lang!r}: expected one of {sorted(LANGUAGES)} "
                            "(a block in another language is not run: give it `no-run` and a reason)")
        if unknown := block.attrs - ATTRIBUTES:
            problems.append(f"{where}: unknown attributes {sorted(unknown)}: expected some of {sorted(ATTRIBUTES)}")
        if "output" in block.attrs and (block.lang != "text" or example.previous is None
                                        or example.previous.lang not in ("python", "bash")):
            problems.append(f"{where}: `output` goes on a `text` block right after a python or bash block")
        if "ray" in block.attrs and block.lang not in RUNNABLE:
            problems.append(f"{where}: `ray` goes on a runnable block ({sorted(RUNNABLE)})")
        if "no-run" in block.attrs and block.lang == "text":
            problems.append(f"{where}: a text block is never run: it needs no `no-run`")
        if "no-run" in block.attrs and not NO_RUN_REASON.match(block.above):
            problems.append(f"{where}: a no-run block needs `<!-- no-run: <reason> -->` on the line above, got {block.above!r}")
        if block.lang == "console":
            try:
                _markdown.console_steps(block.text)
            except ValueError as exc:
                problems.append(f"{where}: {exc}")
    assert not problems, "\n".join(problems)


def test_the_readme_opens_with_the_set_up_commands(ran: dict[str, Ran]) -> None:
    """The README's first block is the two set-up commands, word for word, and its demo runs."""
    first = next(e for e in EXAMPLES if e.is_set_up)
    assert (first.block.lang, first.block.text) == ("bash", SET_UP), first.block.text
    assert first.block.line == 3, "the set-up commands are the README's first lines after its title"
    assert ran[first.id].problems == [], ran[first.id].problems[0]


@pytest.mark.timeout(60)
def test_the_demo_imports_the_installed_mpvisor_not_the_checkouts(tmp_path: pathlib.Path) -> None:
    """`pip install . && python scripts/demo.py` tours what was installed: the checkout goes on
    `sys.path` after the installed packages (here, a stand-in `mpvisor` on PYTHONPATH), for
    `workers/` alone."""
    installed = tmp_path / "site" / "mpvisor"
    installed.mkdir(parents=True)
    (installed / "__init__.py").write_text("import sys\nprint('the installed mpvisor')\nsys.exit(3)\n")
    env = {**environment(tmp_path), "PYTHONPATH": str(tmp_path / "site")}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "demo.py")], cwd=tmp_path, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout) == (3, "the installed mpvisor\n"), _failed("demo.py", done)


@pytest.mark.parametrize("example", LOCAL, ids=lambda e: e.id)
def test_block(example: Example, ran: dict[str, Ran]) -> None:
    """The block runs as its info string says (the module table)."""
    problems = ran[example.id].problems
    assert not problems, f"{example.id} ({example.block.lang}):\n" + "\n".join(problems)


@pytest.mark.parametrize("example", [e for e in OUTPUTS if e.previous is None or "ray" not in e.previous.attrs],
                         ids=lambda e: e.id)
def test_output_block(example: Example, ran: dict[str, Ran]) -> None:
    """A `text output` block is exactly what the block above it prints: its stdout, and nothing
    on stderr (a warning, a subscriber's panic or a traceback there is output the reader would
    see and the block does not show)."""
    above = _ran_above(ran, example)
    assert above.stdout == example.block.text, f"{example.id}: the block above printed\n{above.stdout}"
    assert above.stderr == "", f"{example.id}: the block above also wrote on stderr\n{above.stderr}"


@pytest.fixture(scope="module")
def ran_on_ray(ray_cluster: Any) -> dict[str, Ran]:
    """Every `ray` block, run concurrently against the session's Ray cluster."""
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        futures = {e.id: pool.submit(run_block, e.block, ray_cluster.address) for e in ON_RAY}
        return {key: future.result() for key, future in futures.items()}


@pytest.mark.ray
@pytest.mark.parametrize("example", ON_RAY, ids=lambda e: e.id)
def test_ray_block(example: Example, ran_on_ray: dict[str, Ran], on_ray: Any) -> None:
    """A `ray` block runs against the session's Ray cluster (`RAY_ADDRESS`), as a user's
    program connects to a configured cluster (and `on_ray` checks that nothing of mpvisor's is
    left on it)."""
    outcome = ran_on_ray[example.id]
    assert not outcome.problems, f"{example.id}:\n" + "\n".join(outcome.problems)
    shown = output_after(example)
    if shown is not None:
        assert outcome.stdout == shown.block.text, f"{shown.id}: the block above printed\n{outcome.stdout}"
        assert outcome.stderr == "", f"{shown.id}: the block above also wrote on stderr\n{outcome.stderr}"


# --- links -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=relative)
def test_every_relative_link_reaches_a_file(page: pathlib.Path) -> None:
    """Each relative link reaches a file or directory of the repository, and its `#anchor`
    a heading of the Markdown file it points at."""
    broken: list[str] = []
    for line, target in _markdown.links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        reached = (page.parent / path).resolve() if path else page
        if not reached.exists():
            broken.append(f"{relative(page)}:{line}: {target} (no file {reached})")
        elif anchor and reached.suffix == ".md" and anchor not in _markdown.anchors(reached.read_text(encoding="utf-8")):
            broken.append(f"{relative(page)}:{line}: {target} (no heading #{anchor} in {relative(reached)})")
    assert not broken, "\n".join(broken)


def test_every_page_of_the_guide_is_in_its_index() -> None:
    index = GUIDE / "README.md"
    linked = {(index.parent / target.partition("#")[0]).resolve()
              for _, target in _markdown.links(index.read_text(encoding="utf-8"))}
    missing = [relative(page) for page in PAGES if page.parent == GUIDE and page != index and page.resolve() not in linked]
    assert not missing, f"pages of the guide not linked from docs/README.md: {missing}"


# --- the configuration reference -------------------------------------------------------------------

REQUIRED = "required"
SETTINGS: dict[str, Callable[..., Any]] = {
    "SupervisorConfig": mpvisor.SupervisorConfig,
    "TaskSpec": mpvisor.TaskSpec,
    "TaskDefaults": mpvisor.TaskDefaults,
    "ControllerConfig": mpvisor.ControllerConfig,
    "Limits": mpvisor.Limits,
    "RestartIntensity": mpvisor.RestartIntensity,
    "Resources": mpvisor.Resources,
    "BackoffPolicy.exponential": mpvisor.BackoffPolicy.exponential,
    "RayLauncher": RayLauncher,
    "TaskFn": mpvisor.TaskFn,
    "CommandTask": mpvisor.CommandTask,
}


def _names() -> dict[str, Any]:
    """What a documented default may name: mpvisor's public names, and `signal` (a stop signal's)."""
    return {"signal": signal, **{name: getattr(mpvisor, name) for name in mpvisor.__all__}}


def _parameters(thing: Callable[..., Any]) -> dict[str, Any]:
    """A class's or function's parameters -> their defaults (`REQUIRED` when none)."""
    parameters = inspect.signature(thing).parameters.values()
    return {p.name: REQUIRED if p.default is inspect.Parameter.empty else p.default
            for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_the_configuration_reference_states_every_setting_and_its_real_default(name: str) -> None:
    """docs/configuration.md has a section `` `<name>` `` whose table lists each parameter once,
    as `` `field` `` and its default as a Python expression (or `required`), equal to the real one."""
    text = (GUIDE / "configuration.md").read_text(encoding="utf-8")
    rows = _markdown.table_rows(text, f"`{name}`")
    documented: dict[str, str] = {}
    for row in rows:
        spans = _markdown.code_spans(row[0])
        assert len(spans) == 1 and len(row) >= 3, f"{name}: a row is | `field` | `default` | meaning |, got {row}"
        assert spans[0] not in documented, f"{name}: {spans[0]} is documented twice"
        documented[spans[0]] = row[1]
    real = _parameters(SETTINGS[name])
    assert sorted(documented) == sorted(real), f"{name}: documented {sorted(documented)}, real {sorted(real)}"
    for field, cell in documented.items():
        if real[field] == REQUIRED:
            assert cell == REQUIRED, f"{name}.{field} has no default: the cell says {cell!r}, expected {REQUIRED!r}"
            continue
        spans = _markdown.code_spans(cell)
        assert len(spans) == 1, f"{name}.{field}: the default cell is one Python expression in backticks, got {cell!r}"
        value = eval(spans[0], _names())
        assert value == real[field], f"{name}.{field}: documented default {spans[0]} = {value!r}, real {real[field]!r}"


# --- the CLI reference -----------------------------------------------------------------------------


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Each documented name of a parser's arguments (its longest option string, or a
    positional's metavar) -> its action, `--help` left out."""
    found: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.option_strings:
            found[max(action.option_strings, key=len)] = action
        else:
            found[str(action.metavar or action.dest)] = action
    return found


def real_commands() -> dict[str, argparse.ArgumentParser]:
    """`mpvisor` and each command of its table (`mpvisor slots serve` included)."""
    parser, commands = _cli.make_parser()
    return {"mpvisor": parser, **{f"mpvisor {name}": sub for name, sub in commands.items()}}


def documented_commands() -> dict[str, list[list[str]]]:
    text = (GUIDE / "cli.md").read_text(encoding="utf-8")
    found: dict[str, list[list[str]]] = {}
    for heading in _markdown.sections(text):
        spans = _markdown.code_spans(heading)
        if len(spans) == 1 and spans[0].startswith("mpvisor") and heading.strip() == f"`{spans[0]}`":
            found[spans[0]] = _markdown.table_rows(text, heading)
    return found


def test_the_cli_reference_has_a_section_for_every_command() -> None:
    assert sorted(documented_commands()) == sorted(real_commands())


@pytest.mark.parametrize("command", sorted(real_commands()))
def test_the_cli_reference_documents_every_option_and_nothing_else(command: str) -> None:
    """The command's table has one row per option (`--name NAME`, the real metavar) and
    positional (its metavar); the value column names every choice; the default column holds
    the real default."""
    rows = documented_commands()[command]
    real = _options(real_commands()[command])
    documented: dict[str, list[str]] = {}
    for row in rows:
        spans = _markdown.code_spans(row[0])
        assert spans and len(row) >= 4, f"{command}: a row is | `--option METAVAR` | value | default | meaning |, got {row}"
        documented[spans[0].split()[0].rstrip(".")] = row
    assert sorted(documented) == sorted(real), f"{command}: documented {sorted(documented)}, real {sorted(real)}"
    for name, action in real.items():
        row = documented[name]
        written = _markdown.code_spans(row[0])[0]
        if action.option_strings and action.nargs != 0:
            metavar = action.metavar or (None if action.choices else action.dest.upper())
            if metavar is not None:
                assert written == f"{name} {metavar}", f"{command}: {name} is written `{name} {metavar}` in its help, here `{written}`"
        for choice in action.choices or ():
            assert f"`{choice}`" in row[1], f"{command} {name}: choice {choice!r} not in the value column {row[1]!r}"
        default = action.default
        if default not in (None, False, argparse.SUPPRESS) and not isinstance(default, list):
            shown = f"{default:g}" if isinstance(default, float) else str(default)
            assert f"`{shown}`" in row[2], f"{command} {name}: default {shown!r} not in the default column {row[2]!r}"


BOUNDED = ("SECONDS", "N", "SIZE", "LINES", "N/SECONDS")  # the metavars of options in seconds, counts and sizes
SAYS_ZERO_REFUSED = re.compile(r"> 0|>= 1|from (1|0\.01)\b|\b2 to\b")


@pytest.mark.parametrize("command", sorted(real_commands()))
def test_the_cli_reference_says_which_options_refuse_zero(command: str) -> None:
    """An option in seconds, a count or a size whose parser refuses 0 says its bound in the
    value column (`> 0`, `>= 1`, `from 1`, ...), and one whose parser takes 0 does not: the
    value column of `mpvisor slots serve --idle-exit` said `seconds`, and 0 was a usage error.
    A value column `as `--memory`` is that option's."""
    rows = {_markdown.code_spans(row[0])[0].split()[0].rstrip("."): row for row in documented_commands()[command]}
    wrong: list[str] = []
    for name, action in _options(real_commands()[command]).items():
        if not action.option_strings or action.nargs == 0 or str(action.metavar) not in BOUNDED:
            continue
        assert callable(action.type), (command, name)
        try:
            action.type("0")
            refused = False
        except (argparse.ArgumentTypeError, ValueError, TypeError):
            refused = True
        value = rows[name][1]
        if (same := re.fullmatch(r"as `(--[a-z-]+)`", value)) is not None:
            value = rows[same.group(1)][1]
        if bool(SAYS_ZERO_REFUSED.search(value)) != refused:
            wrong.append(f"{command} {name}: its parser {'refuses' if refused else 'takes'} 0, the value column says {value!r}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("command", sorted(real_commands()))
def test_an_options_help_names_its_default_where_the_reference_gives_one(command: str) -> None:
    """`--help` says `default` for each option whose default column in docs/cli.md holds one
    (not `-`, `none` or `off`): `mpvisor run --backoff`'s said only `seconds between retries`,
    where the reference says 0.2 s doubling up to 30 s."""
    rows = {_markdown.code_spans(row[0])[0].split()[0].rstrip("."): row for row in documented_commands()[command]}
    silent = [name for name, action in _options(real_commands()[command]).items()
              if not re.match(r"^(-$|none\b|off\b)", rows[name][2].strip()) and "default" not in (action.help or "")]
    assert not silent, f"{command}: --help names no default for {silent}, docs/cli.md does"


# --- outcome, rejection and event tables -----------------------------------------------------------


@pytest.mark.parametrize(("page", "heading", "kinds"), [
    ("outcomes.md", "Outcome kinds", mpvisor.OutcomeKind),
    ("outcomes.md", "Rejection kinds", mpvisor.RejectionKind),
    ("events.md", "Event kinds", mpvisor.EventKind),
])
def test_every_kind_is_listed_with_its_label(page: str, heading: str, kinds: type[enum.Enum]) -> None:
    """The table's first column names each member once (`` `NAME` ``), its last the label."""
    rows = _markdown.table_rows((GUIDE / page).read_text(encoding="utf-8"), heading)
    listed = {_markdown.code_spans(row[0])[0]: _markdown.code_spans(row[-1]) for row in rows}
    assert sorted(listed) == sorted(kinds.__members__), f"{page} {heading}: {sorted(listed)}"
    for name, member in kinds.__members__.items():
        label = getattr(member, "label")  # noqa: B009 (every mpvisor enum has one; Enum does not declare it)
        assert listed[name] == [label], f"{page} {heading}: {name}'s label is {label!r}, listed {listed[name]}"


def test_the_exit_status_table_is_the_one_the_commands_use() -> None:
    """docs/outcomes.md's exit statuses are `statuses.TABLE`, row for row, in order."""
    rows = _markdown.table_rows((GUIDE / "outcomes.md").read_text(encoding="utf-8"), "Exit statuses of `mpvisor run`")
    assert [tuple(row) for row in rows] == list(statuses.TABLE)


def test_the_event_fields_are_the_real_ones() -> None:
    rows = _markdown.table_rows((GUIDE / "events.md").read_text(encoding="utf-8"), "Event fields")
    listed = [span for row in rows for span in _markdown.code_spans(row[0])]
    assert sorted(listed) == sorted(mpvisor.Event._fields)


def test_the_outcome_fields_are_the_real_ones() -> None:
    """docs/outcomes.md lists every field of `TaskOutcome` once, and nothing else (`lease_lost`
    was missing from it)."""
    rows = _markdown.table_rows((GUIDE / "outcomes.md").read_text(encoding="utf-8"), "What an outcome holds")
    listed = [_markdown.code_spans(row[0])[0] for row in rows]
    assert sorted(listed) == sorted(f.name for f in dataclasses.fields(mpvisor.TaskOutcome))


# --- the parser of these tests ---------------------------------------------------------------------


@pytest.mark.unit
def test_blocks_are_read_with_their_info_string_line_and_the_line_above() -> None:
    text = ("# t\n<!-- no-run: why -->\n```bash no-run\necho a\n```\n\n````text output\n```\nx\n```\n"
            "````\n```` not`a fence\n~~~\nunclosed\n")
    found = _markdown.blocks(text)
    assert [(b.line, b.end, b.lang, sorted(b.attrs), b.text, b.above) for b in found] == [
        (3, 5, "bash", ["no-run"], "echo a\n", "<!-- no-run: why -->"),
        (7, 11, "text", ["output"], "```\nx\n```\n", ""),
        (13, 15, "", [], "unclosed\n\n", "```` not`a fence"),  # a backtick in the info string: no fence
    ]


@pytest.mark.unit
def test_console_steps_pair_commands_with_what_they_print() -> None:
    steps = _markdown.console_steps("$ echo a \\\n  b\na b\n$ true\n$ printf 'x\\ny\\n'\nx\ny\n")
    assert steps == [("echo a \\\n  b", "a b\n"), ("true", ""), ("printf 'x\\ny\\n'", "x\ny\n")]
    with pytest.raises(ValueError, match="must start with"):
        _markdown.console_steps("output first\n$ true\n")


@pytest.mark.unit
def test_links_skip_code_and_anchors_follow_github() -> None:
    text = ("# The `run` command, again!\n[a](x.md#the-run-command-again) `[b](no.md)` <!-- [c](no.md) -->\n"
            "```text\n[d](no.md)\n```\n[ref]: y.md\n## Twice\n## Twice\n")
    assert _markdown.links(text) == [(2, "x.md#the-run-command-again"), (6, "y.md")]
    assert _markdown.anchors(text) == {"the-run-command-again", "twice", "twice-1"}


@pytest.mark.unit
def test_table_rows_leave_out_headers_and_keep_escaped_pipes() -> None:
    text = "## S\n\n| a | b |\n|---|---|\n| `x\\|y` | 1 |\n\n| c |\n|:--|\n| 2 |\n## T\n| 3 |\n"
    assert _markdown.table_rows(text, "S") == [["`x|y`", "1"], ["2"]]
