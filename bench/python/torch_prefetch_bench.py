"""Backward time of an L-layer MoE stack through stashd.torch on the host backend: with
prefetch, without prefetch, and the same stack without any stash, in one run.

    PYTHONPATH=client/python /usr/bin/python3 bench/python/torch_prefetch_bench.py \
        --stashd build/release/daemon/stashd

It starts its own stashd (on a socket in a temporary directory) unless --socket names one.
The model is examples/python/megatron_moe.py's stack (grouped experts marked as TE marks them,
3 stashes per layer). Each configuration runs --warmup untimed steps, then --repeats timed ones;
only backward is timed (forward, with its stashes, is not), and the median is printed with the
ratio to the stack without the stash, and the time backward spent inside the unpack hooks
(stash_torch.counters()["unpack_us"]: starting prefetches, waiting for reloads, copying rows out,
which is what prefetch takes off the critical path). On the host backend the daemon's copies
run on the same CPUs as the trainer's backward, so overlapping them only pays where a core is
free. Numbers move on a shared machine: read the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, os.pardir, "examples", "python"))

import stashd  # noqa: E402
import stashd.torch as stash_torch  # noqa: E402
from megatron_moe import build  # noqa: E402

READY_TIMEOUT_S = 10.0


def start_daemon(binary: str, directory: str, pool: str):
    socket = os.path.join(directory, "stashd.sock")
    log = open(os.path.join(directory, "stashd.log"), "wb")
    proc = subprocess.Popen([binary, f"--socket={socket}", f"--pool-bytes={pool}",
                             "--host-tier-bytes=0"], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            stashd.connect(socket, connect_timeout_ms=200).close()
            return proc, socket
        except stashd.StashError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise SystemExit(f"stashd did not start; see {log.name}")
            time.sleep(0.05)


def backward_time(model, batch) -> float:
    for p in model.parameters():
        p.grad = None
    loss = model(batch).pow(2).mean()
    start = time.perf_counter()
    loss.backward()
    return time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stashd", default=os.path.join(HERE, os.pardir, os.pardir, "build",
                                                    "release", "daemon", "stashd"))
    p.add_argument("--socket", help="use this running daemon instead of starting one")
    p.add_argument("--pool-bytes", default="2GiB")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--ffn", type=int, default=512)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (1: the daemon's copies get the other cores)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="stashd-bench-") as tmp:
        proc = None
        socket = args.socket
        if socket is None:
            proc, socket = start_daemon(args.stashd, tmp, args.pool_bytes)
        try:
            g = torch.Generator().manual_seed(0)
            batches = [torch.randn(args.tokens, args.hidden, generator=g, dtype=torch.float64)
                       for _ in range(args.warmup + args.repeats)]
            # One client per configuration (prefetch depth is per client), and the
            # configurations take turns step by step, so that load drifting on a shared
            # machine hits them alike.
            configs = []
            for name, depth in [("no stash", None), ("stash, no prefetch", 0),
                                ("stash, prefetch depth 1", 1), ("stash, prefetch depth 2", 2)]:
                client = None
                if depth is not None:
                    client = stashd.connect(socket, label=f"bench-{name}")
                    stash_torch.set_prefetch(client, depth=depth)
                configs.append((name, client, build(client, args, seed=0)))
            times = {name: [] for name, _, _ in configs}
            hooks = {name: [] for name, _, _ in configs}
            for i, batch in enumerate(batches):
                for name, client, model in configs:
                    before = stash_torch.counters(client).get("unpack_us", 0) if client else 0
                    elapsed = backward_time(model, batch)
                    if i >= args.warmup:
                        times[name].append(elapsed)
                        if client is not None:
                            hooks[name].append(
                                (stash_torch.counters(client).get("unpack_us", 0) - before) / 1e3)
            results = {}
            for name, client, _ in configs:
                stats = client.stats() if client is not None else None
                results[name] = (statistics.median(times[name]),
                                 statistics.median(hooks[name]) if hooks[name] else 0.0,
                                 stats.reloads if stats else 0, stats.overflows if stats else 0)
                if client is not None:
                    client.close()
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait()

    base = results["no stash"][0]
    no_prefetch = results["stash, no prefetch"][0]
    print(f"backward of a {args.layers}-layer MoE stack (tokens={args.tokens} "
          f"hidden={args.hidden} ffn={args.ffn} experts={args.experts} top-{args.topk}, "
          f"float64, {args.threads} torch thread(s)), median of {args.repeats}:")
    print("| configuration | backward ms | vs no stash | vs no prefetch | in unpack hooks ms "
          "| reloads | overflows |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, (t, hook_ms, reloads, overflows) in results.items():
        print(f"| {name} | {t * 1e3:.1f} | {t / base:.2f}x | {t / no_prefetch:.2f}x | "
              f"{hook_ms:.1f} | {reloads} | {overflows} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
