"""What do the documentation tests read out of a Markdown file? (pure: text in, records out)

`tests/whole/test_docs.py` runs what these functions find in `README.md` and `docs/*.md`.

| function | returns |
|---|---|
| `blocks(text)` | every fenced code block: its language, attributes, text, line and the line above it |
| `console_steps(block_text)` | a ```console transcript as `(command, shown output)` pairs |
| `links(text)` | every link target outside code (inline `[text](target)` and `[label]: target`), with its line |
| `anchors(text)` | the `#anchor` of each heading, as GitHub renders it |
| `table_rows(text, heading)` | the cells of every table row in the section under `heading` |

A block's info string is its language (the first word) and its attributes (the other words):
```` ```text output ```` is a `text` block with the attribute `output`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\".*\")?\s*$")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_COMMENT = re.compile(r"<!--.*?-->", re.S)


@dataclass(frozen=True)
class Block:
    """One fenced code block: `line` is the opening fence's (1-based), `above` the line just
    above the fence (stripped; "" at the top of the file)."""

    line: int
    end: int  # the closing fence's line (the last line of the text, if the fence is never closed)
    lang: str
    attrs: frozenset[str]
    text: str
    above: str


def blocks(text: str) -> list[Block]:
    """Every fenced code block of `text`, in order. An unclosed fence runs to the end of the
    text, as CommonMark has it."""
    found: list[Block] = []
    lines = text.split("\n")
    at = 0
    while at < len(lines):
        opening = _FENCE.match(lines[at])
        if opening is None or (opening["fence"][0] == "`" and "`" in opening["info"]):
            at += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        words = opening["info"].split()
        body: list[str] = []
        end = at + 1
        while end < len(lines):
            closing = _FENCE.match(lines[end])
            if closing is not None and closing["fence"][0] == fence[0] and len(closing["fence"]) >= len(fence) \
                    and not closing["info"].strip():
                break
            line = lines[end]
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))):])
            end += 1
        above = lines[at - 1].strip() if at > 0 else ""
        found.append(Block(at + 1, min(end + 1, len(lines)), words[0] if words else "", frozenset(words[1:]),
                           "\n".join(body) + "\n", above))
        at = end + 1
    return found


def console_steps(text: str) -> list[tuple[str, str]]:
    """A transcript as `(command, output)` pairs: a line starting `$ ` is a command (a trailing
    backslash continues it on the next line), and the lines up to the next command are what it
    prints. Text before the first command is a `ValueError`: a transcript shows what ran."""
    steps: list[tuple[str, list[str]]] = []
    lines = text.rstrip("\n").split("\n")
    at = 0
    while at < len(lines):
        line = lines[at]
        if line.startswith("$ "):
            command = [line[2:]]
            while command[-1].endswith("\\") and at + 1 < len(lines):
                at += 1
                command.append(lines[at])
            steps.append(("\n".join(command), []))
        elif not steps:
            raise ValueError(f"a console block must start with a `$ ` command line, got {line!r}")
        else:
            steps[-1][1].append(line)
        at += 1
    return [(command, "".join(f"{line}\n" for line in output)) for command, output in steps]


def _prose(text: str) -> list[str]:
    """The lines of `text` with fenced blocks blanked and HTML comments removed (line numbers
    kept): what is left is prose and headings."""
    lines = text.split("\n")
    for block in blocks(text):
        for index in range(block.line - 1, block.end):
            lines[index] = ""
    return _COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), "\n".join(lines)).split("\n")


def links(text: str) -> list[tuple[int, str]]:
    """Every link target in the prose of `text`, as `(line, target)`."""
    found: list[tuple[int, str]] = []
    for number, line in enumerate((_CODE_SPAN.sub("", line) for line in _prose(text)), start=1):
        found.extend((number, match.group(1)) for match in _INLINE_LINK.finditer(line))
        reference = _REFERENCE.match(line)
        if reference is not None:
            found.append((number, reference.group(1)))
    return found


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, markup and punctuation dropped (but `-`
    and `_`), spaces turned into `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of every heading in `text` (a repeated heading gets `-1`, `-2`, ...)."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in _prose(text):
        heading = _HEADING.match(line)
        if heading is None:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def sections(text: str) -> dict[str, str]:
    """Each heading's text (markup kept) -> the lines under it, up to the next heading of the
    same or a higher level."""
    lines = text.split("\n")
    prose = _prose(text)
    heads = [(index, len(m.group(1)), m.group(2)) for index, line in enumerate(prose) if (m := _HEADING.match(line))]
    found: dict[str, str] = {}
    for position, (index, level, title) in enumerate(heads):
        end = next((i for i, lvl, _ in heads[position + 1:] if lvl <= level), len(lines))
        found[title] = "\n".join(lines[index + 1:end])
    return found


def table_rows(text: str, heading: str) -> list[list[str]]:
    """The cells (stripped) of every table row under `heading`, each table's header row and
    separator left out; `KeyError` if there is no such heading."""
    tables: list[list[str]] = []
    inside = False
    for line in sections(text)[heading].split("\n"):
        stripped = line.strip()
        if stripped.startswith("|"):
            if not inside:
                tables.append([])
            tables[-1].append(stripped)
        inside = stripped.startswith("|")
    rows: list[list[str]] = []
    for table in tables:
        cells = [[cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip("|"))] for line in table]
        if len(cells) > 1 and all(re.fullmatch(r":?-+:?", cell) for cell in cells[1]):
            cells = cells[2:]
        rows.extend(cells)
    return rows


def code_spans(cell: str) -> list[str]:
    """The inline code spans of a table cell, without their backticks."""
    return [match.group(0).strip("`").strip() for match in _CODE_SPAN.finditer(cell)]
