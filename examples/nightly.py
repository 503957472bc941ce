"""The targets of examples/tasks.toml (a task file names them as `"nightly:fetch"`, ...).

A task file's targets are imported by name, as on the command line: from the directory
`mpvisor run --file` runs in, so keep this module next to tasks.toml and run from there.

    cd examples && mpvisor run --file tasks.toml
"""

from __future__ import annotations

import mpvisor


def fetch(source: str, pages: int) -> int:
    """Fetch `pages` pages of `source` (a stand-in); the first attempt fails, as a flaky source does."""
    ctx = mpvisor.context()
    if ctx.attempt == 1:
        raise mpvisor.Fail(f"{source}: not ready yet")
    for page in range(1, pages + 1):
        ctx.progress(page, pages, f"{source} page {page}")
    return pages


def report(source: str) -> str:
    """Build the report of `source` (a stand-in)."""
    return f"report of {source}"
