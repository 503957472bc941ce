#!/bin/bash
# `file_steps.sh MARKER TASKFILE`: a deployment-like script whose middle step runs a task file
# under `mpvisor run --file` (the first `mpvisor` on PATH). No `set -e`: when that step dies by
# SIGINT, bash stops the script by itself, as it does for any program.
marker=$1
taskfile=$2
echo before >> "$marker"
mpvisor run --file "$taskfile"
echo "after $?" >> "$marker"
