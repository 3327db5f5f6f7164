"""stashd.torch on a small MoE block: with the stash, forward and backward are bit-identical to
a run without it, also when the pool spills to the host tier or overflows."""

from __future__ import annotations

import os
import random

import pytest

torch = pytest.importorskip("torch")  # stashd.torch is optional: skip without torch

import stashd
import stashd.torch as stash_torch
from moe import BLOCK, make_params, moe_layer, moe_model

TOKENS, HIDDEN, FFN, EXPERTS, TOPK, LAYERS = 64, 32, 32, 4, 2, 2
# Per layer: FC1's data and scale_inv, SwiGLU's input, FC2's input, the permuted probs.
STASHES_PER_LAYER = 5


def seed_for_test() -> int:
    seed = int(os.environ.get("STASHD_TEST_SEED", random.SystemRandom().randrange(1 << 31)))
    print(f"seed {seed} (rerun with STASHD_TEST_SEED={seed})")
    return seed


def run_step(seed: int, client=None, **kwargs):
    """One forward + backward; returns (output, gradients, per-layer records)."""
    g = torch.Generator().manual_seed(seed)
    layers = [make_params(g, HIDDEN, FFN, EXPERTS) for _ in range(LAYERS)]
    x = torch.randn(TOKENS, HIDDEN, generator=g, dtype=torch.float64).requires_grad_()
    grad_out = torch.randn(TOKENS, HIDDEN, generator=g, dtype=torch.float64)
    records = []
    out = moe_model(x, layers, TOPK, client, records=records, **kwargs)
    out.backward(grad_out)
    grads = [("x", x.grad)]
    for i, p in enumerate(layers):
        grads += [(f"layer{i}.router", p.router.grad), (f"layer{i}.fc1", p.fc1.grad),
                  (f"layer{i}.fc2", p.fc2.grad)]
    return out.detach(), grads, records


def assert_bit_identical(expected, actual):
    out_e, grads_e, _ = expected
    out_a, grads_a, _ = actual
    assert torch.equal(out_e, out_a), "forward output differs"
    for (name, ge), (_, ga) in zip(grads_e, grads_a):
        assert ge is not None and ga is not None, name
        assert torch.equal(ge, ga), f"gradient of {name} differs"


@pytest.mark.parametrize("zero_tail,count_as_tensor", [(False, True), (True, False)])
def test_moe_forward_backward_bit_identical_with_the_stash(client, zero_tail, count_as_tensor):
    seed = seed_for_test()
    total = 0
    for step in range(3):
        client.begin_step(step)
        expected = run_step(seed + step)
        actual = run_step(seed + step, client, zero_tail=zero_tail,
                          count_as_tensor=count_as_tensor)
        assert_bit_identical(expected, actual)
        for record in actual[2]:
            ctx = record.context
            assert (ctx.stashed, ctx.overflowed) == (STASHES_PER_LAYER, 0)
            assert ctx.passed > 0  # weights and FC2's unmarked output stayed in-process
            assert record.num_tokens % BLOCK == 0 and record.num_tokens <= record.max_tokens
        total += STASHES_PER_LAYER * LAYERS
        stats = client.stats()
        assert (stats.stashes, stats.reloads, stats.overflows) == (total, total, 0)
        assert stats.bytes_reloaded == stats.bytes_stashed > 0
        # The end of a step: every stash came back, every page returned.
        assert stats.stashes_live == 0 and stats.pages_used == 0
        assert client.step_flags() == stashd.StepFlags(overflow=False, spilled=False)
        # Staging buffers are pooled: later steps allocate no new shared memory.
        staging = len(client._extensions["torch"]._all)
        if step == 0:
            staging_after_first_step = staging
        assert staging == staging_after_first_step


def test_moe_parity_when_the_pool_spills_to_the_host_tier(start_daemon):
    seed = seed_for_test()
    d = start_daemon("--pool-bytes=256KiB", "--host-tier-bytes=4MiB", "--page-bytes=64KiB")
    with d.connect() as c:
        for step in range(2):
            c.begin_step(step)
            assert_bit_identical(run_step(seed + step), run_step(seed + step, c))
            assert c.step_flags() == stashd.StepFlags(overflow=False, spilled=True)
        stats = c.stats()
        assert stats.spills > 0 and stats.overflows == 0
        assert stats.reloads == stats.stashes == 2 * STASHES_PER_LAYER * LAYERS
        assert stats.pages_used == 0
        assert c.begin_step(2).step_spilled is True
        assert c.step_flags().spilled is False


def test_moe_parity_when_the_pool_overflows(start_daemon):
    seed = seed_for_test()
    d = start_daemon("--pool-bytes=256KiB", "--host-tier-bytes=0", "--page-bytes=64KiB")
    with d.connect() as c:
        for step in range(2):
            c.begin_step(step)
            actual = run_step(seed + step, c)
            assert_bit_identical(run_step(seed + step), actual)
            assert c.step_flags() == stashd.StepFlags(overflow=True, spilled=False)
            overflowed = sum(r.context.overflowed for r in actual[2])
            stashed = sum(r.context.stashed for r in actual[2])
            assert overflowed > 0 and stashed > 0
            assert overflowed + stashed == STASHES_PER_LAYER * LAYERS
        stats = c.stats()
        # `stashes` counts what the daemon took; an overflow took nothing and is not reloaded.
        assert stats.overflows > 0 and stats.reloads == stats.stashes
        assert stats.pages_used == 0


def test_forward_without_backward_returns_the_pages(client):
    seed = seed_for_test()
    g = torch.Generator().manual_seed(seed)
    p = make_params(g, HIDDEN, FFN, EXPERTS)
    x = torch.randn(TOKENS, HIDDEN, generator=g, dtype=torch.float64).requires_grad_()
    out = moe_layer(x, p, TOPK, client)
    assert client.stats().stashes_live == STASHES_PER_LAYER
    del out  # the graph goes, and with it every handle autograd held
    stash_torch.flush(client)
    stats = client.stats()
    assert stats.releases == STASHES_PER_LAYER and stats.pages_used == 0


def test_moe_block_gradients_are_right():
    # The test model itself: its hand-written backward passes agree with finite differences.
    from moe import MoeParams

    seed = seed_for_test()
    g = torch.Generator().manual_seed(seed)
    p = make_params(g, 4, 3, 3)  # 3 experts, top-2: routing really chooses
    x = torch.randn(6, 4, generator=g, dtype=torch.float64).requires_grad_()

    def layer(x, router, fc1, fc2):
        return moe_layer(x, MoeParams(router, fc1, fc2), 2)

    assert torch.autograd.gradcheck(layer, (x, p.router, p.fc1, p.fc2))
