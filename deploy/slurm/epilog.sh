#!/usr/bin/env bash
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/stashd-epilog.sh): stops the per-job stashd
# that prolog.sh started for this job on this node, and removes its directory. Does nothing
# for jobs that used the node-wide service (no pid file).
#
# stashd exits 0 within 5 s of SIGTERM; this waits up to 10 s (STASH_SLURM_STOP_TIMEOUT_S),
# then sends SIGKILL. Slurm drains a node whose Epilog fails, so problems are only logged.
#
# Runs as root under slurmd, with SLURM_JOB_ID set.
set -euo pipefail

PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH

# (STASH_SLURM_DEFAULTS names another file, for tests.)
defaults=${STASH_SLURM_DEFAULTS:-/etc/default/stashd}
if [[ -r "$defaults" ]]; then
  set -a
  # shellcheck source=/dev/null
  . "$defaults"
  set +a
fi

job_root=${STASH_SLURM_JOB_ROOT:-/run/stashd-jobs}
stop_timeout_s=${STASH_SLURM_STOP_TIMEOUT_S:-10}

log() { echo "stashd-epilog[job ${SLURM_JOB_ID:-?}]: $*" >&2; }

# True while process $1 exists and is not a zombie.
alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  # The state follows the command name, which is in parentheses and may hold anything.
  stat=${stat##*) }
  [[ "${stat%% *}" != Z ]]
}

job_id=${SLURM_JOB_ID:?SLURM_JOB_ID is not set: run this as a Slurm Epilog}
job_dir=$job_root/$job_id
pid_file=$job_root/$job_id.pid

if [[ ! -e "$pid_file" ]]; then
  # No per-job daemon (the node runs stashd as a service, or the prolog did not start one).
  [[ -d "$job_dir" ]] && rm -rf -- "$job_dir"
  exit 0
fi

pid=$(<"$pid_file")
if [[ ! "$pid" =~ ^[0-9]+$ ]]; then
  log "ignoring $pid_file: '$pid' is not a pid"
  rm -rf -- "$job_dir" "$pid_file"
  exit 0
fi

# Signal only our daemon: the pid may have been reused since the prolog wrote it.
comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
if alive "$pid" && [[ "$comm" == stashd ]]; then
  kill -TERM "$pid" 2>/dev/null || true
  deadline=$((SECONDS + stop_timeout_s))
  while alive "$pid" && ((SECONDS < deadline)); do
    sleep 0.1
  done
  if alive "$pid"; then
    log "stashd (pid $pid) still running ${stop_timeout_s} s after SIGTERM; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    # SIGKILL lands asynchronously: wait (briefly) until the process is really gone.
    deadline=$((SECONDS + 5))
    while alive "$pid" && ((SECONDS < deadline)); do
      sleep 0.05
    done
  fi
fi

rm -rf -- "$job_dir" "$pid_file"
exit 0
