"""On PYTHONPATH, a `sitecustomize` that stops every interpreter started with `-c` (how mpvisor
starts its launcher) before it runs: status 3 and one line on stderr, as a launcher that cannot
start on a broken host does. `mpvisor` itself (a console script) and the programs it runs start
as usual."""

import os
import sys

if "-c" in sys.orig_argv:
    sys.stderr.write("the launcher cannot start on this host\n")
    os._exit(3)
