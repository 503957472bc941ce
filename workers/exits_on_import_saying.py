"""What if the target's module ends the program with a message as it is imported?

Importing this module calls `sys.exit("no config: set APP_CONFIG")` at module level (a script
that checks its configuration as it starts). Never import it in the test process.

| function | does | ends |
|---|---|---|
| `target()` | never reached | returns `"imported"` |
"""

from __future__ import annotations

import sys

sys.exit("no config: set APP_CONFIG")


def target() -> str:
    return "imported"
