#!/bin/bash
# `branches.sh OUT`: a script that branches on `mpvisor run`'s exit status, as scripts do; each
# step writes "NAME STATUS" (or the branch it took) to OUT.
out=$1
mpvisor run -- sh -c 'exit 7'
echo "exit7 $?" >> "$out"
mpvisor run --timeout 0.1 -- sleep 10
echo "timeout $?" >> "$out"
mpvisor run -- sh -c 'kill -KILL $$'
echo "killed $?" >> "$out"
if mpvisor run userflat.mod:double 21; then
    echo "double succeeded" >> "$out"
else
    echo "double failed $?" >> "$out"
fi
if mpvisor run -- false; then
    echo "false succeeded" >> "$out"
else
    echo "false failed $?" >> "$out"
fi
