"""What if the target's module ends the program as it is imported?

Importing this module calls `sys.exit(9)` at module level (a script written to be run, not
imported, whose start-up code checks its arguments and exits). Never import it in the test
process.

| function | does | ends |
|---|---|---|
| `target()` | never reached | returns `"imported"` |
"""

from __future__ import annotations

import sys

sys.exit(9)


def target() -> str:
    return "imported"
