#!/usr/bin/env bash
# shellcheck disable=SC2317  # the step_* functions run indirectly, through STEPS
# The one-call GPU check (docs/gpu-check.md): on ONE GPU, every GPU gtest (lazy and eager module
# loading), the demo on the CUDA backend (both loadings) and the PyTorch path
# (torch_cuda_check.py), and the stash-bench-gpu benchmarks, each step under `timeout`, the whole
# run under 9 minutes. Every step runs even when an earlier one failed; the summary is printed last.
#
# The GPU: STASH_CHECK_GPU (default 0), the index nvidia-smi -L gives it. Every step sees that GPU
# only (CUDA_VISIBLE_DEVICES=<its UUID>), so the daemon never opens a context on another job's
# GPU; bench_peer alone also sees a second one, STASH_CHECK_PEER_GPU (default the next index),
# and skips without it. The preflight prints its compute mode and stops when two processes cannot hold contexts
# on it at once (EXCLUSIVE_PROCESS, PROHIBITED), when MIG is on, or when too little memory is free.
#
# Layout: run from a bundle (./scripts/bundle), i.e. <bundle>/check.sh next to bin/ (stashd,
# stashctl, stash-demo, stash-bench-gpu, stash-bench-request), lib/ (shared libraries), tests/
# (the GPU gtest binaries) and run (the launcher, which picks the C++ runtime: the node's
# libstdc++/libgcc_s, or the bundle's lib/fallback/). From the source tree (tests/gpu/check.sh)
# it uses the build in $BUNDLE, default build/release.
#
# Output: each step's full output goes to $OUT/<step>.log (and the benchmarks' JSON to
# $OUT/<name>.json) when $OUT is set, else to a fresh temporary folder; the summary goes to
# summary.txt there too. Exit status 0 when every step passed, else 1 (also when the preflight
# stopped: then summary.txt holds its one message).
#
# Some steps only: STASH_CHECK_STEPS="gtests bench_copy" (names of STEPS below, separated by
# spaces or commas; they run in STEPS's order). A name that is no step stops the check before
# any step runs, listing the names.
#
# Adding a step: write a function step_<name> that ends with `record`, and add <name> to STEPS
# below (the order they run in; each step_* may read $gpu, $out, $tmp and the helpers here).
set -uo pipefail

# Every step, in the order they run. Each step_<name> records one or more summary rows.
STEPS=(gtests demo bench_copy bench_request bench_ipc bench_overlap bench_mapped_overlap bench_wait
  bench_peer)

here="$(cd "$(dirname "$0")" && pwd)"
if [ -d "$here/bin" ]; then
  layout=bundle
  root="$here"
else
  layout=build
  root="${BUNDLE:-$here/../../build/release}"
  root="$(cd "$root" 2>/dev/null && pwd || echo "$root")"
fi

# The path of binary $1: bin/ of a bundle, else its folder in a build tree.
find_bin() {
  if [ "$layout" = bundle ]; then
    echo "$root/bin/$1"
    return
  fi
  case "$1" in
    stashd) echo "$root/daemon/stashd" ;;
    stashctl) echo "$root/client/stashctl/stashctl" ;;
    stash-demo) echo "$root/examples/stash-demo" ;;
    stash-bench-gpu | stash-bench-request) echo "$root/bench/gpu/$1" ;;
    *) echo "$root/bin/$1" ;;
  esac
}

# The bundle's binaries find its lib/ through their RUNPATH ($ORIGIN/../lib). LD_LIBRARY_PATH
# gets lib/fallback/ (libstdc++, libgcc_s) only when the preflight finds the node's C++ runtime
# lacking (./run --runtime), never lib/: it also reaches python3, and `import torch` would then
# load the bundle's gRPC, protobuf or OpenSSL instead of its own. (The fallback libstdc++ is the
# newer one there, so torch runs on it; libstash_client.so needs it in that process too.)
if [ "$layout" = bundle ]; then
  test_dir="$root/tests"
else
  test_dir="$root/tests/gpu"
fi

out="${OUT:-}"
if [ -z "$out" ]; then out="$(mktemp -d /tmp/stash-gpu-check.XXXXXX)"; fi
mkdir -p "$out"
tmp="$(mktemp -d /tmp/stash-gpu-check-run.XXXXXX)"
daemon_pid=""
cleanup() {
  if [ -n "$daemon_pid" ]; then kill -KILL "$daemon_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

start_s=$(date +%s)
# Every step ends by this deadline (8.5 minutes), whatever hangs.
deadline=$((start_s + 510))
# Seconds a step may take: its CAP, or less so that each of the STEPS_AFTER it keeps 20 s.
step_budget() {  # step_budget CAP STEPS_AFTER
  local left=$((deadline - $(date +%s) - 20 * $2))
  if [ "$left" -lt 10 ]; then left=10; fi
  if [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
# Rows of the summary: "step<TAB>status<TAB>numbers".
summary=()
any_failed=0
# record STEP "pass|skip|fail [(why)]" NUMBERS [LOG]: a failed step also shows the end of its LOG.
record() {
  local status="${2%% *}" why=""
  if [ "$status" != "$2" ]; then
    why="${2#* }"
    why="${why#(}"
    why="${why%)}"
  fi
  local detail="$why${why:+${3:+; }}$3"
  summary+=("$1"$'\t'"$status"$'\t'"$detail")
  echo "== $1: $status${detail:+ ($detail)}"
  if [ "$status" = fail ]; then
    any_failed=1
    if [ -n "${4:-}" ] && [ -f "$4" ]; then tail -n 20 "$4" | sed 's/^/   | /'; fi
  fi
}

# The value of "key" $2 in JSON file $1 (numbers with 2 decimals), or "?". With SECTION $3, only
# on the line of the one-line object "SECTION": {...} (the benchmarks write `summary` that way):
# without it, the first occurrence anywhere, which for a key that also appears per size is the
# first size's, not the summary's.
json_num() {
  local v src
  if [ -n "${3:-}" ]; then
    src="$(grep "\"$3\": {" "$1" 2>/dev/null | head -n 1)"
  else
    src="$(cat "$1" 2>/dev/null)"
  fi
  v="$(grep -o "\"$2\": [^,}]*" <<<"$src" | head -n 1 | sed 's/^[^:]*: //; s/"//g')"
  case "$v" in
    '') echo "?" ;;
    *[!0-9.eE+-]*) echo "$v" ;;
    *) printf '%.2f\n' "$v" 2>/dev/null || echo "$v" ;;
  esac
}

# How a finished command went: "pass", "fail (exit N)" or "fail (timeout after Ns)".
status_of() {  # status_of EXIT_CODE TIMEOUT_S
  case "$1" in
    0) echo pass ;;
    124 | 137) echo "fail (timeout after $2 s)" ;;
    *) echo "fail (exit $1)" ;;
  esac
}

# Stops the check before any step: MESSAGE on stdout and as the whole summary.txt, exit 1.
stop() {
  echo "stash GPU check: $*" | tee "$out/summary.txt"
  exit 1
}

echo "stash GPU check: $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname), $layout at $root"
echo "output: $out"

# ---- Preflight 1: glibc, the C++ runtime and the driver, before anything runs -----------------
# What the binaries need: a bundle says it in REQUIRES (scripts/bundle: the highest GLIBC_
# version any shipped ELF but lib/fallback/ needs, the same with lib/fallback/, and the driver
# series of its CUDA runtime); a build tree runs where it was built. Its launcher (./run
# --runtime) says whether the node's libstdc++/libgcc_s define every version the bundle needs,
# else the bundle's lib/fallback/ goes on LD_LIBRARY_PATH, and then the glibc that needs counts.
# Too old: stop here with what to change, rather than with loader errors in every step.
need_glibc="" need_glibc_fallback="" need_driver="" runtime=""
if [ "$layout" = bundle ] && [ -f "$root/REQUIRES" ]; then
  need_glibc="$(sed -n 's/^glibc //p' "$root/REQUIRES")"
  need_glibc_fallback="$(sed -n 's/^glibc-fallback //p' "$root/REQUIRES")"
  need_driver="$(sed -n 's/^driver //p' "$root/REQUIRES")"
fi
glibc="$(ldd --version 2>&1 | head -n 1)"
driver=""
if command -v nvidia-smi >/dev/null 2>&1; then
  driver="$(timeout 15 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
fi
if [ -z "$driver" ] && [ -r /proc/driver/nvidia/version ]; then
  driver="$(sed -n 's/.*Kernel Module *\([0-9][0-9.]*\).*/\1/p' /proc/driver/nvidia/version | head -n 1)"
fi
echo "\$ ldd --version: $glibc"
echo "NVIDIA driver: ${driver:-none found}"
glibc_version="$(echo "$glibc" | grep -o '[0-9]\+\.[0-9]\+$')"
if [ "$layout" = bundle ]; then
  with_fallback=""
  if [ -n "$need_glibc_fallback" ]; then
    with_fallback=" ($need_glibc_fallback with the bundle's C++ runtime, lib/fallback/)"
  fi
  echo "needs: glibc >= ${need_glibc:-?}$with_fallback, NVIDIA driver >= R${need_driver:-?} (REQUIRES)"
else
  echo "needs: what the build machine has (a build tree; a bundle says it in REQUIRES)"
fi
# Whether version $1 is older than $2 (x.y).
older() { [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n 1)" = "$1" ]; }
if [ -n "$glibc_version" ] && [ -n "$need_glibc" ] && older "$glibc_version" "$need_glibc"; then
  stop "this machine's glibc $glibc_version is older than $need_glibc, which these binaries" \
    "need: run them on a newer OS (Ubuntu 22.04 or 24.04, Debian 12, RHEL 10), or build them" \
    "on this node's OS (docs/gpu-check.md, \"Older nodes\")"
fi
# The C++ runtime (a bundle with a launcher; an older bundle has libstdc++ in lib/).
if [ "$layout" = bundle ] && [ -x "$root/run" ]; then
  runtime="$("$root/run" --runtime 2>/dev/null | head -n 1)"
  echo "C++ runtime (./run --runtime): ${runtime:-? (./run --runtime printed nothing)}"
  case "$runtime" in
    fallback:*)
      case "$root" in
        *:*) stop "the bundle's path $root has a ':', which LD_LIBRARY_PATH cannot hold: move it" ;;
      esac
      export LD_LIBRARY_PATH="$root/lib/fallback${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      if [ -n "$glibc_version" ] && [ -n "$need_glibc_fallback" ] &&
        older "$glibc_version" "$need_glibc_fallback"; then
        why="${runtime#*because }"
        stop "this machine's glibc $glibc_version is older than $need_glibc_fallback, which the" \
          "bundle's own C++ runtime (lib/fallback/) needs, and the node's cannot be used:" \
          "${why%; needs glibc*}. Give the node GCC 12's libstdc++ or a newer one (Ubuntu 22.04's" \
          "libstdc++6 is), run on glibc $need_glibc_fallback or newer, or build on this node's" \
          "OS (docs/gpu-check.md, \"Older nodes\")"
      fi ;;
    node:*) ;;
    *) stop "$root/run --runtime gave no answer (\"$runtime\"): run it by hand to see why" ;;
  esac
fi
driver_major="${driver%%.*}"
if [ -n "$driver_major" ] && [ -n "$need_driver" ] && [ "$driver_major" -lt "$need_driver" ] 2>/dev/null; then
  stop "NVIDIA driver $driver is older than the R$need_driver series, which the CUDA runtime" \
    "of these binaries needs: install driver R$need_driver or newer, NVIDIA's CUDA" \
    "forward-compatibility package (datacenter GPUs), or build with a CUDA toolkit this driver" \
    "runs (docs/gpu-check.md, \"Older nodes\")"
fi

# The binaries load here (the loader finds every library, glibc has every symbol they bind):
# stashd --version needs no GPU, and stash-bench-gpu --help neither.
for b in stashd stash-bench-gpu; do
  if ! loaded="$(timeout 15 "$(find_bin "$b")" --help 2>&1 >/dev/null | head -n 3)" ||
    grep -q 'error while loading\|not found\|GLIBC_' <<<"$loaded"; then
    stop "$(find_bin "$b") does not start on this machine: ${loaded:-no output}"
  fi
done
echo "binaries load: $("$(find_bin stashd)" --version 2>&1 | head -n 1)"

# ---- The steps asked for (STASH_CHECK_STEPS), before anything looks for a GPU --------------------
if [ -n "${STASH_CHECK_STEPS:-}" ]; then
  picked=()
  for name in ${STASH_CHECK_STEPS//,/ }; do
    known=0
    for s in "${STEPS[@]}"; do [ "$s" = "$name" ] && known=1; done
    if [ "$known" = 0 ]; then
      stop "STASH_CHECK_STEPS names \"$name\", which is not a step: pick from ${STEPS[*]}"
    fi
  done
  for s in "${STEPS[@]}"; do
    for name in ${STASH_CHECK_STEPS//,/ }; do
      if [ "$s" = "$name" ]; then
        picked+=("$s")
        break
      fi
    done
  done
  STEPS=("${picked[@]}")
  echo "steps (STASH_CHECK_STEPS): ${STEPS[*]}"
fi

# ---- Preflight 2: the one GPU the check uses -----------------------------------------------------
gpu="${STASH_CHECK_GPU:-0}"
case "$gpu" in
  '' | *[!0-9]*) stop "STASH_CHECK_GPU=$gpu is not a GPU index: give one index as nvidia-smi -L lists it (0, 1, ...)" ;;
esac
if ! command -v nvidia-smi >/dev/null 2>&1; then
  stop "no GPU found: nvidia-smi is not installed, so this machine has no NVIDIA driver (or it" \
    "is not in PATH); everything before this point ran. Run the check on a GPU node."
fi
{
  echo "\$ nvidia-smi -L"
  timeout 15 nvidia-smi -L
} >"$out/nvidia-smi.log" 2>&1
cat "$out/nvidia-smi.log"
gpus="$(grep -c '^GPU [0-9]' "$out/nvidia-smi.log")"
if [ "$gpus" = 0 ]; then
  stop "no GPU found: nvidia-smi -L lists none (see $out/nvidia-smi.log); everything before" \
    "this point ran. Run the check on a GPU node."
fi
# index, uuid, name, driver, total MiB, used MiB, free MiB, compute mode, MIG mode.
query=index,uuid,name,driver_version,memory.total,memory.used,memory.free,compute_mode,mig.mode.current
# The CSV row of GPU $1 for $query, "" when nvidia-smi has no such GPU; a driver too old to know
# MIG is asked again without that field ("[N/A]" in its place). The commands and their answers
# go to nvidia-smi.log.
gpu_row() {
  local idx="$1" answer row
  answer="$(timeout 15 nvidia-smi -i "$idx" --query-gpu="$query" --format=csv 2>&1)"
  printf '$ nvidia-smi -i %s --query-gpu=%s --format=csv\n%s\n' "$idx" "$query" "$answer" \
    >>"$out/nvidia-smi.log"
  row="$(sed -n "/^index, uuid/{n;p;q}" <<<"$answer")"
  if [ -z "$row" ] && grep -qi "not a valid field" <<<"$answer"; then
    answer="$(timeout 15 nvidia-smi -i "$idx" --query-gpu="${query%,mig.mode.current}" --format=csv 2>&1)"
    printf '$ nvidia-smi -i %s --query-gpu=%s --format=csv\n%s\n' "$idx" \
      "${query%,mig.mode.current}" "$answer" >>"$out/nvidia-smi.log"
    row="$(sed -n "/^index, uuid/{n;p;q}" <<<"$answer")"
    if [ -n "$row" ]; then row="$row, [N/A]"; fi
  fi
  echo "$row"
}
row="$(gpu_row "$gpu")"
if [ -z "$row" ] || ! [[ "$row" =~ ^$gpu, ]]; then
  stop "STASH_CHECK_GPU=$gpu: nvidia-smi has no GPU $gpu (it lists $gpus, 0 to $((gpus - 1)))"
fi
IFS=',' read -r _ gpu_uuid gpu_name gpu_driver mem_total mem_used mem_free compute_mode mig_mode <<<"$row"
trim() { sed 's/^ *//; s/ *$//' <<<"$1"; }
gpu_uuid="$(trim "$gpu_uuid")" gpu_name="$(trim "$gpu_name")" gpu_driver="$(trim "$gpu_driver")"
mem_total="$(trim "$mem_total")" mem_used="$(trim "$mem_used")" mem_free="$(trim "$mem_free")"
compute_mode="$(trim "$compute_mode")" mig_mode="$(trim "$mig_mode")"
echo "GPU $gpu (STASH_CHECK_GPU): $gpu_name, $gpu_uuid, driver $gpu_driver, $mem_total total," \
  "$mem_used used, $mem_free free; compute mode $compute_mode; MIG $mig_mode"
case "$compute_mode" in
  Exclusive_Process | Exclusive_Thread)
    stop "GPU $gpu is in compute mode $compute_mode: only one process may hold a context on it," \
      "and the check runs stashd beside its clients (the demo's ranks, the tests' and" \
      "benchmarks' child processes), each with its own context. Set it to Default" \
      "(nvidia-smi -i $gpu -c DEFAULT, as root), or pick a GPU in Default mode with STASH_CHECK_GPU" ;;
  Prohibited)
    stop "GPU $gpu is in compute mode Prohibited: no process may create a context on it. Pick" \
      "another GPU with STASH_CHECK_GPU, or set it to Default (nvidia-smi -i $gpu -c DEFAULT)" ;;
esac
if [ "$mig_mode" = Enabled ]; then
  stop "GPU $gpu has MIG enabled: the check needs a whole GPU (CUDA IPC and the benchmarks'" \
    "figures assume one). Pick another GPU with STASH_CHECK_GPU, or disable MIG on it"
fi
# The largest step holds about 5 GiB on the GPU (stashd's 4 GiB pool; copy: a 2 GiB pool, 1 GiB
# source and destination): a GPU that another job fills would fail steps for the wrong reason.
free_mib="${mem_free%% *}"
if [ -n "$free_mib" ] && [ "$free_mib" -eq "$free_mib" ] 2>/dev/null && [ "$free_mib" -lt 6144 ]; then
  stop "GPU $gpu has $mem_free free ($mem_used used by other processes): the check needs" \
    "6144 MiB. Pick an idle GPU with STASH_CHECK_GPU"
fi
# Every CUDA process from here on sees that GPU only, as device 0.
export CUDA_VISIBLE_DEVICES="$gpu_uuid"
record nvidia-smi pass "GPU $gpu: $gpu_name, driver $gpu_driver, $mem_total, compute mode $compute_mode; CUDA_VISIBLE_DEVICES=$gpu_uuid"

# ---- Steps --------------------------------------------------------------------------------------
# STEPS (at the top), or those STASH_CHECK_STEPS picked (the preflight checked the names).
# How many steps come after the running one (for step_budget).
steps_after=0

# Each GPU gtest binary twice: CUDA's default lazy module loading, and EAGER (every kernel loaded
# at context creation, as some clusters set it): a kernel that only fails to load one way shows.
step_gtests() {
  local gtests runs=() t run mode name left per_test code passed failed skipped status
  mapfile -t gtests < <(find "$test_dir" -maxdepth 1 -type f -perm -u+x -name '*_test' 2>/dev/null | sort)
  if [ ${#gtests[@]} -eq 0 ]; then
    record gtests "fail (no test binaries in $test_dir)" ""
    return
  fi
  for t in "${gtests[@]}"; do runs+=("LAZY $t" "EAGER $t"); done
  left=${#runs[@]}
  for run in "${runs[@]}"; do
    mode="${run%% *}" t="${run#* }"
    name="$(basename "$t")"
    if [ "$mode" = EAGER ]; then name="$name-eager"; fi
    left=$((left - 1))
    per_test="$(step_budget 90 $((left + steps_after)))"
    # STASHD_BIN_DIR: where tests that start stashd (cuda_lease_gpu_test) find it.
    STASHD_BIN_DIR="$(dirname "$(find_bin stashd)")" \
      CUDA_MODULE_LOADING="$mode" timeout --kill-after=10 "$per_test" "$t" --gtest_color=no \
      >"$out/$name.log" 2>&1
    code=$?
    passed="$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\{0,1\}\..*/\1/p' "$out/$name.log" | tail -n 1)"
    failed="$(sed -n 's/^\[  FAILED  \] \([0-9]*\) tests\{0,1\}, listed below.*/\1/p' "$out/$name.log" | tail -n 1)"
    skipped="$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\{0,1\}, listed below.*/\1/p' "$out/$name.log" | tail -n 1)"
    passed="${passed:-0}" failed="${failed:-0}" skipped="${skipped:-0}"
    status="$(status_of "$code" "$per_test")"
    # The preflight found the GPU: a test that skips with "no CUDA device" means CUDA could not
    # use it (a driver older than the runtime, say), a failure of the check, not a pass.
    if [ "$status" = pass ] && grep -q "no CUDA device" "$out/$name.log"; then
      status="fail (skipped: CUDA sees no device, yet nvidia-smi lists GPU $gpu)"
    fi
    record "$name" "$status" "passed $passed, failed $failed, skipped $skipped" "$out/$name.log"
  done
}

# Starts stashd --backend=cuda on a private socket; 0 once `stashctl health` answers.
start_daemon() {  # start_daemon LOG
  local sock="$tmp/stashd.sock"
  export STASHD_SOCKET="$sock"
  "$(find_bin stashd)" --backend=cuda --socket="$sock" --pool-bytes=4GiB --host-tier-bytes=1GiB \
    --log-level=info >"$1" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 200); do  # up to 20 s
    if ! kill -0 "$daemon_pid" 2>/dev/null; then return 1; fi
    if timeout 5 "$(find_bin stashctl)" health --socket="$sock" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  return 1
}

stop_daemon() {
  if [ -z "$daemon_pid" ]; then return; fi
  # Up to 5 s for a clean stop, then KILL. A stopped child stays a zombie until `wait` reaps
  # it, and kill -0 succeeds on a zombie: its state in /proc says whether it still runs.
  kill -TERM "$daemon_pid" 2>/dev/null
  local state
  for _ in $(seq 50); do
    state="$(cut -d' ' -f3 "/proc/$daemon_pid/stat" 2>/dev/null)"
    if [ -z "$state" ] || [ "$state" = Z ]; then break; fi
    sleep 0.1
  done
  kill -KILL "$daemon_pid" 2>/dev/null
  wait "$daemon_pid" 2>/dev/null
  daemon_pid=""
}

# stash-demo on the CUDA backend, with lazy and with eager module loading (a first kernel launch
# that synchronises the context must not meet a stream that waits on the daemon), then
# stashd.torch on the GPU: the PyTorch path, parity bit for bit.
step_demo() {
  local sock="$tmp/stashd.sock" mode name demo_log demo_s code
  if ! start_daemon "$out/stashd.log"; then
    record stash-demo "fail (stashd --backend=cuda did not become healthy within 20 s)" "" "$out/stashd.log"
    stop_daemon
    return
  fi
  for mode in LAZY EAGER; do
    name=stash-demo
    if [ "$mode" = EAGER ]; then name=stash-demo-eager; fi
    demo_log="$out/$name.log"
    echo "\$ CUDA_MODULE_LOADING=$mode stash-demo --backend=cuda --ranks=2 --socket=$sock" >"$demo_log"
    demo_s="$(step_budget 60 $((steps_after + 2)))"
    CUDA_MODULE_LOADING="$mode" timeout --kill-after=5 "$demo_s" "$(find_bin stash-demo)" \
      --backend=cuda --ranks=2 --socket="$sock" >>"$demo_log" 2>&1
    code=$?
    echo "\$ stashctl stats" >>"$demo_log"
    timeout 5 "$(find_bin stashctl)" stats --socket="$sock" >>"$demo_log" 2>&1
    record "$name" "$(status_of "$code" "$demo_s")" "2 ranks, backend cuda, CUDA_MODULE_LOADING=$mode" "$demo_log"
  done

  local pkg lib script torch_log torch_s torch_mode torch_name
  if [ "$layout" = bundle ]; then
    pkg="$root/python" lib="$root/lib/libstash_client.so" script="$root/torch_cuda_check.py"
  else
    pkg="$here/../../client/python" lib="$root/client/libstash_client.so"
    script="$here/torch_cuda_check.py"
  fi
  # Daemon-copy, then mapped mode (the library's kernels on PyTorch's current stream).
  for torch_mode in daemon-copy mapped; do
    torch_name=torch-cuda
    if [ "$torch_mode" = mapped ]; then torch_name=torch-cuda-mapped; fi
    torch_log="$out/$torch_name.log"
    torch_s="$(step_budget 90 "$steps_after")"
    PYTHONPATH="$pkg" STASHD_CLIENT_LIB="$lib" timeout --kill-after=5 \
      "$torch_s" python3 "$script" --mode="$torch_mode" >"$torch_log" 2>&1
    code=$?
    case "$code" in
      0) record "$torch_name" pass "$(tail -n 1 "$torch_log")" ;;
      2) record "$torch_name" "skip (no CUDA-enabled torch for python3)" "" ;;
      *) record "$torch_name" "$(status_of "$code" "$torch_s")" "" "$torch_log" ;;
    esac
  done
  stop_daemon
}

run_bench() {  # run_bench BINARY SUBCOMMAND CAP_S [ENV=VALUE...]: prints the status
  local binary="$1" sub="$2" seconds
  seconds="$(step_budget "$3" "$steps_after")"
  shift 3
  rm -f "$out/$sub.json"
  env "$@" timeout --kill-after=5 "$seconds" "$(find_bin "$binary")" "$sub" --json="$out/$sub.json" \
    >"$out/bench-$sub.log" 2>&1
  status_of "$?" "$seconds"
}

step_bench_copy() {
  local status j="$out/copy.json"
  status="$(run_bench stash-bench-gpu copy 90)"
  record "bench copy" "$status" "from 64 MiB, as a share of the faster baseline (SM copy kernel or cudaMemcpyAsync): stash $(json_num "$j" stash_ratio_min_from_64mib summary)x, reload $(json_num "$j" reload_ratio_min_from_64mib summary)x (target >= 0.9); of cudaMemcpyAsync alone: stash $(json_num "$j" stash_ratio_memcpy_min_from_64mib summary)x; largest size: stash $(json_num "$j" stash_hbm_share_largest summary), SM copy $(json_num "$j" sm_copy_hbm_share_largest summary), memcpy $(json_num "$j" memcpy_hbm_share_largest summary) of HBM peak $(json_num "$j" hbm_peak_gbps summary) GB/s; kernel launches of one stash $(json_num "$j" launch_stash_us_median summary) us; small stashes $(json_num "$j" small_ops_per_s_median summary) ops/s; verified $(json_num "$j" verified summary)" "$out/bench-copy.log"
}

# The daemon's whole per-request sequence (CudaExecutor::Stash: set the device, plan, launch,
# copy the plan back, raise the done counter, add the host function, bookkeeping), timed on the
# host through the daemon's own code.
step_bench_request() {
  local status j="$out/request.json"
  status="$(run_bench stash-bench-request request 60)"
  record "bench request" "$status" "daemon-side cost per stash request $(json_num "$j" stash_request_us_median summary) us (p90 $(json_num "$j" stash_request_us_p90 summary); target <= 20), per reload $(json_num "$j" reload_request_us_median summary) us; verified $(json_num "$j" verified summary)" "$out/bench-request.log"
}

step_bench_ipc() {
  local status j="$out/ipc.json"
  status="$(run_bench stash-bench-gpu ipc 60)"
  record "bench ipc" "$status" "IPC open $(json_num "$j" mem_open_first_us_median) us, again $(json_num "$j" mem_open_again_us_median) us, cached $(json_num "$j" cache_lookup_ns_median) ns; event open $(json_num "$j" event_open_us_median) us; HostRegister 4K $(json_num "$j" host_register_4k_us_median) us" "$out/bench-ipc.log"
}

step_bench_overlap() {
  local status j="$out/overlap.json"
  status="$(run_bench stash-bench-gpu overlap 90)"
  record "bench overlap" "$status" "trainer ms lost per GB the copier moved (flat out): kernel $(json_num "$j" trainer_ms_per_gb_kernel_copier summary), copy engine ($(json_num "$j" copy_engine_call summary)) $(json_num "$j" trainer_ms_per_gb_copy_engine_copier summary); both paced to $(json_num "$j" paced_gbps summary) GB/s: slowdown kernel $(json_num "$j" slowdown_kernel_copier summary)x, copy engine $(json_num "$j" slowdown_copy_engine_copier summary)x" "$out/bench-overlap.log"
}

# The overlap experiment with mapped mode (issue 23, step 5): the trainer's slowdown and the
# copier's GB/s with mapped mode's StreamCopier in the trainer (a side stream, VMM chunks), with
# daemon-copy's kernels from another process, and with none; each with CUDA_DEVICE_MAX_CONNECTIONS
# unset and set to 1 (the benchmark runs both trainers as child processes).
step_bench_mapped_overlap() {
  local status j="$out/mapped-overlap.json"
  status="$(run_bench stash-bench-gpu mapped-overlap 150)"
  record "bench mapped-overlap" "$status" "both copiers paced to $(json_num "$j" paced_gbps summary) GB/s, trainer slowdown: mapped $(json_num "$j" slowdown_mapped summary)x, daemon-copy $(json_num "$j" slowdown_daemon_copy summary)x; with CUDA_DEVICE_MAX_CONNECTIONS=1: mapped $(json_num "$j" slowdown_mapped_one_connection summary)x, daemon-copy $(json_num "$j" slowdown_daemon_copy_one_connection summary)x; flat out, copier GB/s and trainer ms lost per GB: mapped $(json_num "$j" mapped_gbps summary) GB/s $(json_num "$j" trainer_ms_per_gb_mapped summary) ms/GB, daemon-copy $(json_num "$j" daemon_copy_gbps summary) GB/s $(json_num "$j" trainer_ms_per_gb_daemon_copy summary) ms/GB; with one connection: mapped $(json_num "$j" mapped_gbps_one_connection summary) GB/s $(json_num "$j" trainer_ms_per_gb_mapped_one_connection summary) ms/GB, daemon-copy $(json_num "$j" daemon_copy_gbps_one_connection summary) GB/s $(json_num "$j" trainer_ms_per_gb_daemon_copy_one_connection summary) ms/GB; mapped with its side stream at the greatest priority: paced slowdown $(json_num "$j" slowdown_mapped_greatest_priority summary)x, flat out $(json_num "$j" mapped_gbps_greatest_priority summary) GB/s $(json_num "$j" trainer_ms_per_gb_mapped_greatest_priority summary) ms/GB; verified $(json_num "$j" verified summary)" "$out/bench-mapped-overlap.log"
}

# How long a trainer stream that waits on a daemon copy's done counter holds the trainer's other
# streams, with CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron's setting: one hardware queue) against
# the default; the benchmark runs both as child processes.
step_bench_wait() {
  local status j="$out/wait.json"
  status="$(run_bench stash-bench-gpu wait 60)"
  record "bench wait" "$status" "another trainer stream held while one waits $(json_num "$j" copy_wait_us summary) us for a daemon copy: $(json_num "$j" held_us_one_connection summary) us with CUDA_DEVICE_MAX_CONNECTIONS=1, $(json_num "$j" held_us_default_connections summary) us with the default" "$out/bench-wait.log"
}

# Mapped mode's peer tier over NVLink (issue 23, step 6): needs a second GPU,
# STASH_CHECK_PEER_GPU (an index as nvidia-smi -L lists it; default the one after
# STASH_CHECK_GPU). Only this step sees two GPUs: CUDA_VISIBLE_DEVICES=<the check's GPU>,<the
# peer>, so the check's GPU is device 0 and the peer device 1. It skips, saying why, without a
# second GPU or when that one cannot be used (a compute mode that refuses a second context, MIG,
# too little free memory), and the benchmark itself skips where device 0 cannot access device 1.
step_bench_peer() {
  local peer="${STASH_CHECK_PEER_GPU:-$((gpu + 1))}" prow status reason j="$out/peer.json"
  local p_uuid p_name p_free p_mode p_mig p_free_mib small large
  case "$peer" in
    '' | *[!0-9]*)
      record "bench peer" "fail (STASH_CHECK_PEER_GPU=$peer is not a GPU index: give one index as nvidia-smi -L lists it)" ""
      return ;;
  esac
  if [ "$peer" = "$gpu" ]; then
    record "bench peer" "skip (STASH_CHECK_PEER_GPU=$peer is the check's own GPU: the peer tier needs another one)" ""
    return
  fi
  if [ "$peer" -ge "$gpus" ]; then
    record "bench peer" "skip (needs a second GPU: nvidia-smi lists $gpus, none is GPU $peer; STASH_CHECK_PEER_GPU picks it)" ""
    return
  fi
  prow="$(gpu_row "$peer")"
  if [ -z "$prow" ] || ! [[ "$prow" =~ ^$peer, ]]; then
    record "bench peer" "skip (nvidia-smi answers nothing for GPU $peer: see nvidia-smi.log)" ""
    return
  fi
  IFS=',' read -r _ p_uuid p_name _ _ _ p_free p_mode p_mig <<<"$prow"
  p_uuid="$(trim "$p_uuid")" p_name="$(trim "$p_name")" p_free="$(trim "$p_free")"
  p_mode="$(trim "$p_mode")" p_mig="$(trim "$p_mig")"
  case "$p_mode" in
    Exclusive_Process | Exclusive_Thread | Prohibited)
      record "bench peer" "skip (peer GPU $peer is in compute mode $p_mode: this check cannot hold a context on it beside its owner's; pick another with STASH_CHECK_PEER_GPU)" ""
      return ;;
  esac
  if [ "$p_mig" = Enabled ]; then
    record "bench peer" "skip (peer GPU $peer has MIG enabled: pick another with STASH_CHECK_PEER_GPU)" ""
    return
  fi
  # The peer holds a 1 GiB pool and a 1 GiB cudaMemcpyPeerAsync buffer.
  p_free_mib="${p_free%% *}"
  if [ -n "$p_free_mib" ] && [ "$p_free_mib" -eq "$p_free_mib" ] 2>/dev/null && [ "$p_free_mib" -lt 4096 ]; then
    record "bench peer" "skip (peer GPU $peer has $p_free free: the step needs 4096 MiB; pick an idle one with STASH_CHECK_PEER_GPU)" ""
    return
  fi
  status="$(run_bench stash-bench-gpu peer 60 CUDA_VISIBLE_DEVICES="$gpu_uuid,$p_uuid")"
  if [ "$status" = pass ] && [ "$(json_num "$j" skipped summary)" = true ]; then
    reason="$(grep '"summary": {' "$j" | head -n 1 | sed -n 's/.*"reason": "\([^"]*\)".*/\1/p')"
    record "bench peer" "skip (${reason:-the benchmark skipped: see bench-peer.log})" ""
    return
  fi
  small="$(json_num "$j" smallest_mib summary)" large="$(json_num "$j" largest_mib summary)"
  record "bench peer" "$status" "GPU $gpu's StreamCopier into chunks of GPU $peer ($p_name): stash/reload ${small%.00} MiB $(json_num "$j" stash_gbps_smallest summary)/$(json_num "$j" reload_gbps_smallest summary) GB/s, ${large%.00} MiB $(json_num "$j" stash_gbps_largest summary)/$(json_num "$j" reload_gbps_largest summary) GB/s; plain SM copy through the same mapping ${large%.00} MiB write/read $(json_num "$j" sm_write_gbps_largest summary)/$(json_num "$j" sm_read_gbps_largest summary) GB/s; cudaMemcpyPeerAsync $(json_num "$j" memcpy_peer_write_gbps_largest summary)/$(json_num "$j" memcpy_peer_read_gbps_largest summary) GB/s; verified $(json_num "$j" verified summary)" "$out/bench-peer.log"
}

total_steps=${#STEPS[@]}
for i in "${!STEPS[@]}"; do
  steps_after=$((total_steps - i - 1))
  "step_${STEPS[$i]}"
done

# ---- Summary (last) ---------------------------------------------------------------------------
{
  echo
  echo "== summary ($(($(date +%s) - start_s)) s; full output in $out)"
  printf '%-24s | %-6s | %s\n' step status "key numbers"
  printf '%s\n' "-------------------------+--------+--------------------------------------------------"
  for row in "${summary[@]}"; do
    IFS=$'\t' read -r step status numbers <<<"$row"
    printf '%-24s | %-6s | %s\n' "$step" "$status" "$numbers"
  done
} | tee "$out/summary.txt"
exit "$any_failed"
