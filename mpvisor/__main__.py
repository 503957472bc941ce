"""`python -m mpvisor ...`: the command-line interface (see `_cli.py`)."""

import sys

from ._cli import main

sys.exit(main())
