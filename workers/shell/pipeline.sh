#!/bin/bash
# `mpvisor run` (given restarts) as the producer of a pipeline whose reader ends early: `head -1`
# exits after one line, so the producer dies by SIGPIPE. Prints each member's status
# (`statuses 141 0`); mpvisor's stderr goes to the file $ERR.
set -o pipefail
"$PYTHON" -m mpvisor run --restart on-failure --backoff 0.1 --jitter none -- "$@" 2>"$ERR" | head -1
echo "statuses ${PIPESTATUS[*]}"
