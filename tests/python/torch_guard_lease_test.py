"""overflow_guard and the automatic mapped lease together: a rerun with the stash off is no
sample of demand, so leases sized by steps that fit stay sized and later steps run once."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")  # stashd.torch is optional: skip without torch

import stashd.torch as stash_torch
from moe import make_params, moe_model

TOKENS, HIDDEN, EXPERTS, TOPK, LAYERS = 128, 64, 4, 2, 2  # ~1.3 MB of stashes a step
STEPS = 8


class Rank:
    def __init__(self, daemon, seed):
        self.client = daemon.connect(mode="mapped")  # automatic lease by default
        g = torch.Generator().manual_seed(seed)
        self.layers = [make_params(g, HIDDEN, HIDDEN, EXPERTS) for _ in range(LAYERS)]
        self.x = torch.randn(TOKENS, HIDDEN, generator=g, dtype=torch.float64)
        self.params = [t for p in self.layers for t in p.tensors()]
        moe_model(self.x, self.layers, TOPK).sum().backward()
        self.expected = [t.grad.clone() for t in self.params]
        self.zero_grad()
        self.guard = stash_torch.overflow_guard(self.client, on_rerun=self.zero_grad)

    def zero_grad(self):
        for t in self.params:
            t.grad = None

    def step(self, n):
        self.zero_grad()
        result = self.guard.run(n, lambda: moe_model(self.x, self.layers, TOPK,
                                                     self.client).sum().backward())
        assert all(torch.equal(e, t.grad) for e, t in zip(self.expected, self.params))
        return result.attempts


def test_two_ranks_on_a_small_pool_rerun_at_most_their_first_step(start_daemon):
    # 64 pages of 64 KiB; both ranks' steps fit it together once their leases are sized.
    d = start_daemon("--pool-bytes=4MiB", "--host-tier-bytes=0", "--page-bytes=64KiB")
    ranks = [Rank(d, seed) for seed in (1, 2)]
    attempts = [[], []]
    for n in range(STEPS):
        for r, rank in enumerate(ranks):
            attempts[r].append(rank.step(n))
    for r in range(2):
        # The first step may overflow (the first lease is a share of the pool, sized before
        # any demand is known); its stash-off rerun does not shrink the lease, so no step
        # after the second reruns.
        assert sum(a - 1 for a in attempts[r]) <= 1, (r, attempts)
        assert attempts[r][2:] == [1] * (STEPS - 2), (r, attempts)
    for rank in ranks:
        rank.client.close()
