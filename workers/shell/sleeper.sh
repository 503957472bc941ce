#!/bin/sh
# `sleeper.sh PIDFILE MARKER`: an attempt for the shell tests. Once running it writes its pid and
# its `sleep` child's pid to PIDFILE (atomically), then waits. A SIGTERM (how mpvisor asks a
# program to stop) is written to MARKER as "terminated" before it exits.
pidfile=$1
marker=$2
trap 'echo terminated >> "$marker"; exit 143' TERM
sleep 30 &
echo "$$ $!" > "$pidfile.tmp" && mv "$pidfile.tmp" "$pidfile"
wait
