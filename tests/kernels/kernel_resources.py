#!/usr/bin/env python3
"""Checks the paging kernels' register and local-memory use, as ptxas reports it for sm_90.

Usage: kernel_resources.py NVCC INCLUDE_DIR FILE.cu [FILE.cu ...]

Every kernel must use no stack frame and spill nothing (a spill goes through local memory, and
the copy kernels must stream at memory bandwidth), and at most MAX_REGISTERS registers, so a
256-thread block of the copy kernels leaves room for four blocks per SM (64K registers). The
kernels launched as one thread (ONE_THREAD: plans, publishes, steps, ring and depot changes)
may use up to MAX_REGISTERS_ONE_THREAD: one thread's registers cost an SM nothing that matters,
and a group member's plan kernel (its claims in the depot) needs more than 64. The numbers of
each kernel are printed, so a CI log shows them. No GPU is needed: only nvcc.
"""
import re
import subprocess
import sys
import tempfile

MAX_REGISTERS = 64
MAX_REGISTERS_ONE_THREAD = 128
# Kernels their launchers start with one thread (client/mapped/cuda/stream_copier.cc's
# one_thread launches, daemon/cuda/paging_kernels.cc's one-thread launches).
ONE_THREAD = {
    "stash_mapped_stash_plan", "stash_mapped_stash_publish", "stash_mapped_reload_publish",
    "stash_mapped_step", "stash_mapped_add_pages", "stash_mapped_remove_chunk",
    "stash_daemon_stash_plan", "stash_daemon_stash_publish", "stash_daemon_reload_publish",
    "stash_daemon_take_chunks", "stash_daemon_return_chunk", "stash_daemon_group_join",
    "stash_daemon_group_take", "stash_daemon_group_out", "stash_daemon_group_reset_high_water",
}


def resources(nvcc, include, source):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as out:
        run = subprocess.run(
            [nvcc, "-cubin", "-std=c++17", "-O3", "-gencode", "arch=compute_90,code=sm_90",
             "--resource-usage", "-I", include, "-o", out.name, source],
            capture_output=True, text=True, check=False)
    if run.returncode != 0:
        sys.exit(f"nvcc failed on {source}:\n{run.stdout}{run.stderr}")
    text = run.stdout + run.stderr
    kernels = {}
    name = None
    for line in text.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            name = m.group(1)
            kernels[name] = {}
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      line)
        if m and name:
            kernels[name].update(stack=int(m.group(1)), spill_stores=int(m.group(2)),
                                 spill_loads=int(m.group(3)))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            kernels[name]["registers"] = int(m.group(1))
    return kernels


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    nvcc, include, sources = sys.argv[1], sys.argv[2], sys.argv[3:]
    failures = []
    checked = 0
    for source in sources:
        for name, r in resources(nvcc, include, source).items():
            if "registers" not in r:
                continue  # a device function, not an entry point
            checked += 1
            print(f"{name}: {r['registers']} registers, stack {r['stack']} B, "
                  f"spills {r['spill_stores']}/{r['spill_loads']} B")
            if r["stack"] or r["spill_stores"] or r["spill_loads"]:
                failures.append(f"{name} uses local memory (stack {r['stack']} B, spills "
                                f"{r['spill_stores']}/{r['spill_loads']} B)")
            limit = MAX_REGISTERS_ONE_THREAD if name in ONE_THREAD else MAX_REGISTERS
            if r["registers"] > limit:
                failures.append(f"{name} uses {r['registers']} registers (at most {limit})")
    if checked == 0:
        failures.append("no kernel found in ptxas's report")
    for failure in failures:
        print("FAIL:", failure)
    print(f"{checked - len(failures)} passed, {len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
