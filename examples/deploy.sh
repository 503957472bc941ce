#!/usr/bin/env bash
# One deploy per environment at a time, whoever starts it: `mpvisor run --slot`.
#
#   examples/deploy.sh ENVIRONMENT VERSION
#
# Two CI jobs, a cron entry and a person at a shell can all run this script at once: runs for
# the same ENVIRONMENT take turns on the slot "deploy-ENVIRONMENT", shared by every mpvisor
# process of your user on this host. A run that finds the slot busy waits in its queue (it says
# so on stderr) and deploys once the previous deploy's whole process tree has exited. The
# deploy itself runs under this script's mpvisor, with its environment, working directory, stdin
# and terminal (in a terminal it is the foreground job: a prompt in it reads what is typed, and
# Ctrl-Z stops it with mpvisor); Ctrl-C stops it (--grace seconds, then a kill of its tree).
#
# DEPLOY_POLICY=replace makes a newer deploy stop the running one; DEPLOY_POLICY=drop gives up
# at once if one is running. The deploy below is a stand-in that writes when it starts and ends
# to DEPLOY_LOG (default deploy-ENVIRONMENT.log), so you can see that deploys never overlap.
set -uo pipefail

environment=${1:?usage: deploy.sh ENVIRONMENT VERSION}
version=${2:?usage: deploy.sh ENVIRONMENT VERSION}
export DEPLOY_LOG=${DEPLOY_LOG:-deploy-$environment.log}

# The deploy: replace the body with yours (./migrate.sh && kubectl apply -f ..., rsync, ...).
deploy() {
  echo "start $2 $EPOCHREALTIME" >> "$DEPLOY_LOG"
  sleep "${DEPLOY_SECONDS:-1}"
  echo "end $2 $EPOCHREALTIME" >> "$DEPLOY_LOG"
}
export -f deploy

mpvisor run --slot "deploy-$environment" --policy "${DEPLOY_POLICY:-queue}" --grace 30 \
  --name "deploy-$version" -- bash -c 'deploy "$@"' deploy "$environment" "$version"
status=$?
case $status in
  0) echo "$version: deployed to $environment" ;;
  3) echo "$version: another deploy to $environment is running (DEPLOY_POLICY=drop)" ;;
  4) echo "$version: too many deploys to $environment are waiting"; exit 1 ;;
  5) echo "$version: a newer deploy replaced this one while it waited" ;;
  6) echo "$version: a newer deploy stopped this one (DEPLOY_POLICY=replace)" ;;
  *) echo "$version: the deploy to $environment failed (status $status)"; exit 1 ;;
esac
