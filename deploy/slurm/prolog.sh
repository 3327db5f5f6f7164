#!/usr/bin/env bash
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/stashd-prolog.sh): starts a stashd for this job
# on this node, unless the node already runs stashd as a service (systemd unit or Kubernetes
# DaemonSet answering on /run/stashd/stashd.sock), in which case it does nothing.
#
# The per-job daemon:
#   - runs as the job's user, so it can open that user's CUDA IPC handles and shared memory
#     and nobody else can reach it (its directory is 0700, owned by the user);
#   - serves <job root>/<job id>/stashd.sock (job root: STASH_SLURM_JOB_ROOT, default
#     /run/stashd-jobs), its pid in <job root>/<job id>.pid, a root-owned file the user cannot
#     swap; task-prolog.sh hands the socket to every task as STASHD_SOCKET, epilog.sh stops it;
#   - sees the job's GPUs only (CUDA_VISIBLE_DEVICES from Slurm, in PCI bus order);
#   - takes its knobs (STASHD_POOL_BYTES, ...) from /etc/default/stashd, like the service.
#
# Slurm drains a node whose Prolog fails. A daemon that does not come up is therefore only
# logged (the job then runs without a stash: task-prolog.sh exports STASHD_DISABLED=1, and
# stashd.connect() returns a client that stashes nothing), unless STASH_SLURM_STRICT=1 in
# /etc/default/stashd asks for the drain.
#
# Runs as root under slurmd, with SLURM_JOB_ID, SLURM_JOB_UID and SLURM_JOB_GID set.
set -euo pipefail

PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH

# Knobs for the daemon, shared with stashd.service; exported so the daemon reads them.
# (STASH_SLURM_DEFAULTS names another file, for tests.)
defaults=${STASH_SLURM_DEFAULTS:-/etc/default/stashd}
if [[ -r "$defaults" ]]; then
  set -a
  # shellcheck source=/dev/null
  . "$defaults"
  set +a
fi

bin_dir=${STASH_SLURM_BIN_DIR:-/usr/local/bin}
job_root=${STASH_SLURM_JOB_ROOT:-/run/stashd-jobs}
log_dir=${STASH_SLURM_LOG_DIR:-/var/log/stashd}
service_socket=${STASH_SLURM_SERVICE_SOCKET:-/run/stashd/stashd.sock}
strict=${STASH_SLURM_STRICT:-0}
# Large pools take a while to allocate and pin.
ready_timeout_s=${STASH_SLURM_START_TIMEOUT_S:-120}

log() { echo "stashd-prolog[job ${SLURM_JOB_ID:-?}]: $*" >&2; }

# True while process $1 exists and is not a zombie.
alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  # The state follows the command name, which is in parentheses and may hold anything.
  stat=${stat##*) }
  [[ "${stat%% *}" != Z ]]
}

# Ends the prolog after a failure: drains the node only when asked to.
give_up() {
  log "$*"
  if [[ "$strict" == 1 ]]; then
    exit 1
  fi
  exit 0
}

job_id=${SLURM_JOB_ID:?SLURM_JOB_ID is not set: run this as a Slurm Prolog}
job_uid=${SLURM_JOB_UID:?SLURM_JOB_UID is not set: run this as a Slurm Prolog}
job_gid=${SLURM_JOB_GID:-$(id -g "$job_uid")}

# Drop to the job's user. (Run by hand as that user, for a test, it starts as it is.)
if ((EUID == 0)); then
  as_job_user=(setpriv --reuid="$job_uid" --regid="$job_gid" --init-groups)
elif ((EUID == job_uid)); then
  as_job_user=()
else
  give_up "must run as root (or as the job's user) to start stashd for uid $job_uid"
fi

if [[ ! -x "$bin_dir/stashd" || ! -x "$bin_dir/stashctl" ]]; then
  give_up "no stashd/stashctl in $bin_dir; not starting a daemon"
fi

# A node-wide daemon already serves every job: nothing to do.
if [[ -S "$service_socket" ]] &&
  "$bin_dir/stashctl" health --socket="$service_socket" >/dev/null 2>&1; then
  exit 0
fi

job_dir=$job_root/$job_id
socket=$job_dir/stashd.sock
pid_file=$job_root/$job_id.pid

# A leftover of an earlier run of this job id (requeue, prolog rerun): reuse it when it
# serves, else make sure it is gone before starting a new one on the same socket.
if [[ -e "$pid_file" ]]; then
  old_pid=$(<"$pid_file")
  if [[ "$old_pid" =~ ^[0-9]+$ ]] && alive "$old_pid" &&
    [[ "$(cat "/proc/$old_pid/comm" 2>/dev/null)" == stashd ]]; then
    if "$bin_dir/stashctl" health --socket="$socket" >/dev/null 2>&1; then
      log "stashd (pid $old_pid) already serves $socket"
      exit 0
    fi
    log "stopping unhealthy stashd (pid $old_pid) from an earlier run"
    kill -KILL "$old_pid" 2>/dev/null || true
  fi
  rm -f -- "$pid_file" "$socket"
fi

install -d -m 0755 "$job_root" "$log_dir"
install -d -m 0700 -o "$job_uid" -g "$job_gid" "$job_dir"
log_file=$log_dir/stashd-job-$job_id.log

# The job's GPUs only. Slurm numbers GPUs by device minor (PCI order); so must CUDA.
if [[ -z "${CUDA_VISIBLE_DEVICES:-}" && -n "${SLURM_JOB_GPUS:-}" ]]; then
  export CUDA_VISIBLE_DEVICES=$SLURM_JOB_GPUS
fi
export CUDA_DEVICE_ORDER=PCI_BUS_ID

# Pinned host memory for the host tier: raise the limit while still root (setpriv keeps it).
if ! ulimit -l unlimited 2>/dev/null; then
  log "could not raise the locked-memory limit; a large host tier may fail to pin"
fi

# Detach fully (new session, no inherited stdio), or slurmd would wait for the daemon.
# The log file is opened here, as root; the daemon writes through the inherited descriptor.
# (The ${a[@]+...} form keeps bash < 4.4 quiet about an empty array under set -u.)
setsid ${as_job_user[@]+"${as_job_user[@]}"} "$bin_dir/stashd" --socket="$socket" \
  </dev/null >>"$log_file" 2>&1 &
daemon_pid=$!
echo "$daemon_pid" >"$pid_file"
log "started stashd (pid $daemon_pid) on $socket; log $log_file"

# Ready when it answers SERVING; give up early if it died.
deadline=$((SECONDS + ready_timeout_s))
until "$bin_dir/stashctl" health --socket="$socket" >/dev/null 2>&1; do
  if ! alive "$daemon_pid"; then
    rm -f "$pid_file"
    give_up "stashd exited during start; see $log_file"
  fi
  if ((SECONDS >= deadline)); then
    give_up "stashd did not answer SERVING within ${ready_timeout_s} s; see $log_file"
  fi
  sleep 0.2
done
exit 0
