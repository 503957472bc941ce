#!/bin/bash
# A container's entry point, run as PID 1 of a new PID namespace: it starts a helper in the
# background ($ORPHAN, which writes "started" to $F and exits), then, as its last step, execs
# `mpvisor run`, which so becomes PID 1 and the helper's parent. The command says it runs, then
# waits for the file $DONE and exits 6.
"$ORPHAN" &
exec "$PYTHON" -m mpvisor run -- bash -c 'echo running >> "$F"; while [ ! -e "$DONE" ]; do sleep 0.05; done; exit 6'
