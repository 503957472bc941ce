#!/bin/sh
# `sleeper.sh PIDFILE MARKER [stubborn]`: an attempt for the shell tests. Once running it writes
# its pid and its `sleep` child's pid to PIDFILE (atomically), then waits. A SIGTERM (how mpvisor
# asks a program to stop) is written to MARKER as "terminated", a SIGINT (how `mpvisor run`
# passes on the SIGINT that interrupted it) as "interrupted"; then it exits (by the SIGINT), or,
# `stubborn`, waits on (for its tree to be killed).
pidfile=$1
marker=$2
mode=${3:-}
trap 'echo terminated >> "$marker"; [ "$mode" = stubborn ] || exit 143' TERM
trap 'echo interrupted >> "$marker"; [ "$mode" = stubborn ] || { trap - INT; kill -INT $$; }' INT
sleep 30 &
echo "$$ $!" > "$pidfile.tmp" && mv "$pidfile.tmp" "$pidfile"
wait
while [ "$mode" = stubborn ]; do sleep 30 & wait; done  # asked to stop, it goes on
