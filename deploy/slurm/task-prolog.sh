#!/usr/bin/env bash
# Slurm TaskProlog (slurm.conf: TaskProlog=/etc/slurm/stashd-task-prolog.sh): tells every task
# of the job where its stashd is. Slurm runs it as the job's user before each task and sets
# the variables of the "export NAME=value" lines it prints in the task's environment.
#
# With a per-job daemon (started by prolog.sh) it exports that daemon's socket. With the
# node-wide service (its socket, /run/stashd/stashd.sock, is the client library's default) it
# prints nothing. With neither (the prolog could not start stashd and the node is not drained:
# STASH_SLURM_STRICT=0) it exports STASHD_DISABLED=1: stashd.connect() then returns a client
# that stashes nothing and says so once, and the job runs without a stash instead of failing.
set -euo pipefail

# STASH_SLURM_JOB_ROOT may be moved there, for prolog.sh and epilog.sh alike.
# (STASH_SLURM_DEFAULTS names another file, for tests.)
defaults=${STASH_SLURM_DEFAULTS:-/etc/default/stashd}
if [[ -r "$defaults" ]]; then
  # shellcheck source=/dev/null
  . "$defaults"
fi

job_root=${STASH_SLURM_JOB_ROOT:-/run/stashd-jobs}
service_socket=${STASH_SLURM_SERVICE_SOCKET:-/run/stashd/stashd.sock}
job_id=${SLURM_JOB_ID:?SLURM_JOB_ID is not set: run this as a Slurm TaskProlog}
socket=$job_root/$job_id/stashd.sock

if [[ -S "$socket" ]]; then
  echo "export STASHD_SOCKET=$socket"
elif [[ ! -S "$service_socket" ]]; then
  echo "export STASHD_DISABLED=1"
fi
exit 0
