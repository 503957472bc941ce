"""A command only part of which stops at Ctrl-Z, as `sh` blocked in `vfork` leaves one.

Run as `python stops_in_part.py FILE`. Its child, which keeps default signal dispositions and
sleeps, stops at Ctrl-Z as any process does; the main process ignores SIGTSTP and SIGHUP (as a
`dash` blocked in `vfork` until its child execs cannot act on them) and waits for that child.
It writes `up` to FILE once both are set, and `END` once the child has ended; then it exits 0.
The child's command line ends with FILE too, so a test finds both by it.
"""

from __future__ import annotations

import os
import signal
import sys

path = sys.argv[1]
child = os.fork()
if child == 0:
    os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(300)", path])
signal.signal(signal.SIGTSTP, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
with open(path, "a") as file:
    file.write("up\n")
os.waitpid(child, 0)
with open(path, "a") as file:
    file.write("END\n")
