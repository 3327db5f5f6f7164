#!/usr/bin/env bash
# The one-call GPU check (docs/gpu-check.md): every GPU gtest, the demo and the PyTorch path
# (torch_cuda_check.py) on the CUDA backend, and the three stash-bench-gpu benchmarks, each step under `timeout`, the whole run under 8 minutes.
# Every step runs even when an earlier one failed; the summary table is printed last.
#
# Layout: run from a bundle (./scripts/bundle), i.e. <bundle>/check.sh next to bin/ (stashd,
# stashctl, stash-demo, stash-bench-gpu), lib/ (shared libraries) and tests/ (the GPU gtest
# binaries). From the source tree (tests/gpu/check.sh) it uses the build in $BUNDLE, default
# build/release.
#
# Output: each step's full output goes to $OUT/<step>.log (and the benchmarks' JSON to
# $OUT/<name>.json) when $OUT is set, else to a fresh temporary folder; the summary goes to
# summary.txt there too. Exit status 0 when every step passed, else 1.
set -uo pipefail

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
    stash-bench-gpu) echo "$root/bench/gpu/stash-bench-gpu" ;;
    *) echo "$root/bin/$1" ;;
  esac
}

# The bundle's binaries find its lib/ through their RUNPATH ($ORIGIN/../lib). No LD_LIBRARY_PATH:
# it would also reach python3, and `import torch` would then load the bundle's libraries instead
# of its own.
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
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
  if [ -n "$daemon_pid" ]; then kill -KILL "$daemon_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

start_s=$(date +%s)
# Every step ends by this deadline (7.5 minutes), whatever hangs.
deadline=$((start_s + 450))
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

# The value of "key": in JSON file $1 (the first occurrence; numbers with 2 decimals), or "?".
json_num() {
  local v
  v="$(grep -o "\"$2\": [^,}]*" "$1" 2>/dev/null | head -n 1 | sed 's/^[^:]*: //')"
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

echo "stash GPU check: $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname), $layout at $root"
echo "output: $out"

# ---- Preflight: glibc and the driver, before anything runs ----------------------------------------
# What the binaries need: a bundle says it in REQUIRES (scripts/bundle: the highest GLIBC_
# version any shipped ELF needs, and the driver series of its CUDA runtime); a build tree runs
# where it was built. The target is glibc 2.28 (tests/bundle); CUDA 13 needs driver R580. Too
# old: stop here with what to change, rather than with loader errors in every step.
need_glibc=2.28 need_driver=580
if [ "$layout" = bundle ] && [ -f "$root/REQUIRES" ]; then
  need_glibc="$(sed -n 's/^glibc //p' "$root/REQUIRES")"
  need_driver="$(sed -n 's/^driver //p' "$root/REQUIRES")"
fi
glibc="$(ldd --version 2>&1 | head -n 1)"
driver="$(timeout 15 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
if [ -z "$driver" ] && [ -r /proc/driver/nvidia/version ]; then
  driver="$(sed -n 's/.*Kernel Module *\([0-9][0-9.]*\).*/\1/p' /proc/driver/nvidia/version | head -n 1)"
fi
echo "\$ ldd --version: $glibc"
echo "NVIDIA driver: ${driver:-none found}"
glibc_version="$(echo "$glibc" | grep -o '[0-9]\+\.[0-9]\+$')"
echo "needs: glibc >= ${need_glibc:-?}, NVIDIA driver >= R${need_driver:-?}"
# Whether version $1 is older than $2 (x.y).
older() { [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n 1)" = "$1" ]; }
if [ -n "$glibc_version" ] && [ -n "$need_glibc" ] && older "$glibc_version" "$need_glibc"; then
  echo "stash GPU check: this machine's glibc $glibc_version is older than $need_glibc, which" \
    "these binaries need: run them on a newer OS, or use a bundle built on an older base" \
    "(docs/gpu-check.md)" | tee "$out/summary.txt"
  exit 1
fi
driver_major="${driver%%.*}"
if [ -n "$driver_major" ] && [ -n "$need_driver" ] && [ "$driver_major" -lt "$need_driver" ] 2>/dev/null; then
  echo "stash GPU check: NVIDIA driver $driver is older than the R$need_driver series, which the" \
    "CUDA runtime of these binaries needs: install driver R$need_driver or newer (or NVIDIA's" \
    "CUDA forward-compatibility package)" | tee "$out/summary.txt"
  exit 1
fi

# ---- The machine --------------------------------------------------------------------------------
gpu_present=0
{
  echo "\$ nvidia-smi -L"
  timeout 15 nvidia-smi -L
  echo "\$ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv"
  timeout 15 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
} >"$out/nvidia-smi.log" 2>&1
cat "$out/nvidia-smi.log"
if grep -q '^GPU [0-9]' "$out/nvidia-smi.log"; then gpu_present=1; fi
# The first line after the csv header: "NVIDIA H200, 570.86.15, 143771 MiB".
gpu_name="$(sed -n '/^name, driver_version/{n;p;q}' "$out/nvidia-smi.log")"
if [ "$gpu_present" = 1 ]; then
  record nvidia-smi pass "${gpu_name:-?}"
else
  record nvidia-smi "fail (no GPU listed)" "" "$out/nvidia-smi.log"
fi

# ---- 1. The GPU gtests ----------------------------------------------------------------------------
mapfile -t gtests < <(find "$test_dir" -maxdepth 1 -type f -perm -u+x -name '*_test' 2>/dev/null | sort)
if [ ${#gtests[@]} -eq 0 ]; then
  record gtests "fail (no test binaries in $test_dir)" ""
else
  # Each binary twice: CUDA's default lazy module loading, and EAGER (every kernel loaded at
  # context creation, as some clusters set it): a kernel that only fails to load one way shows.
  runs=()
  for t in "${gtests[@]}"; do runs+=("LAZY $t" "EAGER $t"); done
  left_tests=${#runs[@]}
  for run in "${runs[@]}"; do
    mode="${run%% *}" t="${run#* }"
    name="$(basename "$t")"
    if [ "$mode" = EAGER ]; then name="$name-eager"; fi
    left_tests=$((left_tests - 1))
    per_test="$(step_budget 90 $((left_tests + 4)))"
    CUDA_MODULE_LOADING="$mode" timeout --kill-after=10 "$per_test" "$t" --gtest_color=no \
      >"$out/$name.log" 2>&1
    code=$?
    passed="$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\{0,1\}\..*/\1/p' "$out/$name.log" | tail -n 1)"
    failed="$(sed -n 's/^\[  FAILED  \] \([0-9]*\) tests\{0,1\}, listed below.*/\1/p' "$out/$name.log" | tail -n 1)"
    skipped="$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\{0,1\}, listed below.*/\1/p' "$out/$name.log" | tail -n 1)"
    passed="${passed:-0}" failed="${failed:-0}" skipped="${skipped:-0}"
    status="$(status_of "$code" "$per_test")"
    # Tests skip with "no CUDA device" when CUDA sees none. Without a GPU that is a skip; with
    # one in the machine it means CUDA could not use it (say a driver older than the runtime):
    # a failure of the check, not a pass.
    if [ "$status" = pass ] && grep -q "no CUDA device" "$out/$name.log"; then
      if [ "$gpu_present" = 1 ]; then
        status="fail (skipped: CUDA sees no device, yet nvidia-smi lists one)"
      else
        status="skip (no CUDA device)"
      fi
    fi
    record "$name" "$status" "passed $passed, failed $failed, skipped $skipped" "$out/$name.log"
  done
fi

# ---- 2. stash-demo on the CUDA backend --------------------------------------------------------
sock="$tmp/stashd.sock"
export STASHD_SOCKET="$sock"
stashd="$(find_bin stashd)"
stashctl="$(find_bin stashctl)"
demo_log="$out/stash-demo.log"
{
  echo "\$ stashd --backend=cuda --socket=$sock --pool-bytes=4GiB --host-tier-bytes=1GiB"
} >"$demo_log"
"$stashd" --backend=cuda --socket="$sock" --pool-bytes=4GiB --host-tier-bytes=1GiB \
  --log-level=info >"$out/stashd.log" 2>&1 &
daemon_pid=$!
ready=0
for _ in $(seq 200); do  # up to 20 s
  if ! kill -0 "$daemon_pid" 2>/dev/null; then break; fi
  if timeout 5 "$stashctl" health --socket="$sock" >/dev/null 2>&1; then
    ready=1
    break
  fi
  sleep 0.1
done
if [ "$ready" = 1 ]; then
  echo "\$ stash-demo --backend=cuda --ranks=2 --socket=$sock" >>"$demo_log"
  # --backend: flag added by the cuda backend work (the ranks compute on the GPU).
  demo_s="$(step_budget 90 4)"
  timeout --kill-after=5 "$demo_s" "$(find_bin stash-demo)" --backend=cuda --ranks=2 \
    --socket="$sock" >>"$demo_log" 2>&1
  code=$?
  echo "\$ stashctl stats" >>"$demo_log"
  timeout 5 "$stashctl" stats --socket="$sock" >>"$demo_log" 2>&1
  record stash-demo "$(status_of "$code" "$demo_s")" "2 ranks, backend cuda" "$demo_log"

  # ---- 2b. stashd.torch on the GPU: the PyTorch path, parity bit for bit ----------------------
  if [ "$layout" = bundle ]; then
    pkg="$root/python" lib="$root/lib/libstash_client.so" script="$root/torch_cuda_check.py"
  else
    pkg="$here/../../client/python" lib="$root/client/libstash_client.so"
    script="$here/torch_cuda_check.py"
  fi
  torch_log="$out/torch-cuda.log"
  torch_s="$(step_budget 90 3)"
  PYTHONPATH="$pkg" STASHD_CLIENT_LIB="$lib" timeout --kill-after=5 "$torch_s" \
    python3 "$script" >"$torch_log" 2>&1
  code=$?
  case "$code" in
    0) record torch-cuda pass "$(tail -n 1 "$torch_log")" ;;
    2) record torch-cuda "skip (no CUDA-enabled torch for python3)" "" ;;
    *) record torch-cuda "$(status_of "$code" "$torch_s")" "" "$torch_log" ;;
  esac
else
  echo "stashd did not become healthy within 20 s (see stashd.log)" >>"$demo_log"
  record stash-demo "fail (stashd --backend=cuda did not start)" "" "$out/stashd.log"
fi
if [ -n "$daemon_pid" ]; then
  kill -TERM "$daemon_pid" 2>/dev/null
  for _ in $(seq 50); do  # up to 5 s for a clean stop
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$daemon_pid" 2>/dev/null
  wait "$daemon_pid" 2>/dev/null
  daemon_pid=""
fi

# ---- 3-5. stash-bench-gpu ---------------------------------------------------------------------
bench="$(find_bin stash-bench-gpu)"
run_bench() {  # run_bench SUBCOMMAND CAP_S STEPS_AFTER
  local seconds
  seconds="$(step_budget "$2" "$3")"
  rm -f "$out/$1.json"
  timeout --kill-after=5 "$seconds" "$bench" "$1" --json="$out/$1.json" >"$out/bench-$1.log" 2>&1
  status_of "$?" "$seconds"
}

status="$(run_bench copy 90 2)"
j="$out/copy.json"
record "bench copy" "$status" "stash $(json_num "$j" stash_ratio_min_from_64mib)x, reload $(json_num "$j" reload_ratio_min_from_64mib)x memcpy from 64 MiB (>= 0.9); LaunchStash $(json_num "$j" launch_stash_us_median) us (<= 20); small stashes $(json_num "$j" small_ops_per_s_median) ops/s (2 host fns: $(json_num "$j" small_ops_per_s_two_host_functions_median)); verified $(json_num "$j" verified)" "$out/bench-copy.log"

status="$(run_bench ipc 60 1)"
j="$out/ipc.json"
record "bench ipc" "$status" "IPC open $(json_num "$j" mem_open_first_us_median) us, again $(json_num "$j" mem_open_again_us_median) us, cached $(json_num "$j" cache_lookup_ns_median) ns; event open $(json_num "$j" event_open_us_median) us; HostRegister 4K $(json_num "$j" host_register_4k_us_median) us" "$out/bench-ipc.log"

status="$(run_bench overlap 90 0)"
j="$out/overlap.json"
record "bench overlap" "$status" "trainer slowdown: kernel copier $(json_num "$j" slowdown_kernel_copier)x, copy engine $(json_num "$j" slowdown_copy_engine_copier)x; copier $(json_num "$j" copier_kernel_gbps) / $(json_num "$j" copier_copy_engine_gbps) GB/s" "$out/bench-overlap.log"

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
