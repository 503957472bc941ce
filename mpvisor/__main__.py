"""`python -m mpvisor ...`: the command-line interface (`_cli/main.py`: the table of commands)."""

import sys

from mpvisor._cli.main import main

sys.exit(main())
