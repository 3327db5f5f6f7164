"""One rank of torch_overflow_guard_test: trains one step of the test MoE stack under
stash_torch.overflow_guard over a gloo group and prints a JSON line with what happened.

usage: overflow_guard_worker.py RANK WORLD INIT_FILE SOCKET SEED CONNECT_KWARGS_JSON
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import stashd  # noqa: E402
import stashd.torch as stash_torch  # noqa: E402
from moe import make_params, moe_model  # noqa: E402

TOKENS, HIDDEN, FFN, EXPERTS, TOPK, LAYERS = 64, 32, 32, 4, 2, 2


def main() -> int:
    rank, world, init_file, socket, seed, connect_kwargs = sys.argv[1:7]
    rank, world, seed = int(rank), int(world), int(seed)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    g = torch.Generator().manual_seed(seed + rank)
    layers = [make_params(g, HIDDEN, FFN, EXPERTS) for _ in range(LAYERS)]
    x = torch.randn(TOKENS, HIDDEN, generator=g, dtype=torch.float64)
    params = [t for p in layers for t in p.tensors()]

    def zero_grad():
        for t in params:
            t.grad = None

    moe_model(x, layers, TOPK).sum().backward()  # the reference, without the stash
    expected = [t.grad.clone() for t in params]
    zero_grad()

    kwargs = json.loads(connect_kwargs)
    if "group_secret" in kwargs:  # bytes travel as hex in JSON
        kwargs["group_secret"] = bytes.fromhex(kwargs["group_secret"])
    client = stashd.connect(socket, rank=rank, label=f"guard-rank{rank}", **kwargs)
    attempts = []

    def step():
        stashes_before = client.stats().stashes
        moe_model(x, layers, TOPK, client).sum().backward()
        attempts.append({"stash_on": stash_torch._TorchState.of(client).enabled,
                         "stashes": client.stats().stashes - stashes_before,
                         "overflow": client.step_flags().overflow})

    guard = stash_torch.overflow_guard(client, group=dist.group.WORLD, on_rerun=zero_grad)
    result = guard.run(0, step)
    exact = all(torch.equal(e, t.grad) for e, t in zip(expected, params))
    print(json.dumps({"rank": rank, "attempts": result.attempts, "reran": result.reran,
                      "ranks_overflowed": result.ranks_overflowed, "exact": exact,
                      "per_attempt": attempts}), flush=True)
    client.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
