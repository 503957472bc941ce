#!/bin/sh
# `sleeper.sh PIDFILE MARKER [stubborn | held GATE]`: an attempt for the shell tests. Once running
# it writes its pid and its `sleep` child's pid to PIDFILE (atomically), then waits. A SIGTERM (how
# mpvisor asks a program to stop) is written to MARKER as "terminated", a SIGINT (how `mpvisor run`
# passes on the SIGINT that interrupted it) as "interrupted"; then it exits (by the SIGINT), or,
# `stubborn`, waits on (for its tree to be killed). `held`: its stop after a SIGTERM lasts until
# the test lets it end: GATE is a FIFO the test holds open, which the sleeper opens before it
# writes PIDFILE, and it exits once the test closes its end (EOF), not before.
pidfile=$1
marker=$2
mode=${3:-}
if [ "$mode" = held ]; then exec 3< "$4"; fi
trap 'echo terminated >> "$marker"; if [ "$mode" = held ]; then read _ <&3; fi; [ "$mode" = stubborn ] || exit 143' TERM
trap 'echo interrupted >> "$marker"; [ "$mode" = stubborn ] || { trap - INT; kill -INT $$; }' INT
sleep 30 &
echo "$$ $!" > "$pidfile.tmp" && mv "$pidfile.tmp" "$pidfile"
wait
while [ "$mode" = stubborn ]; do sleep 30 & wait; done  # asked to stop, it goes on
