"""`python -m mpvisor ...`: the command-line interface (see `_cli.py`)."""

import sys

from mpvisor._cli.main import main

sys.exit(main())
