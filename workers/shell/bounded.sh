#!/bin/bash
# `bounded.sh MARKER PIDFILE TIMEOUT_ARGS...`: `timeout TIMEOUT_ARGS... mpvisor run` of a
# sleeper, then the status `timeout` ended with, written to MARKER as "status N".
marker=$1
pidfile=$2
shift 2
here=$(dirname "$0")
timeout "$@" mpvisor run -- sh "$here/sleeper.sh" "$pidfile" "$marker"
echo "status $?" >> "$marker"
