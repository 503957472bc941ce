#!/bin/bash
# `steps.sh MARKER PIDFILE [stubborn]`: a deployment-like script of three steps, the middle one
# under `mpvisor run` (the first `mpvisor` on PATH; `stubborn`: a step that does not stop when
# asked). There is no `set -e`: when a foreground step dies by SIGINT, bash stops the script by
# itself (and dies by SIGINT), as it does for any program.
marker=$1
pidfile=$2
here=$(dirname "$0")
echo before >> "$marker"
mpvisor run -- sh "$here/sleeper.sh" "$pidfile" "$marker" ${3:+"$3"}
echo "after $?" >> "$marker"
