"""`python -m mpvisor ...`: the command-line interface (`_cli/entry.py`, then `_cli/main.py`: the table of commands)."""

from mpvisor._cli.entry import cli

cli()
