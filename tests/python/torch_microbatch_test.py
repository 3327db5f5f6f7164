"""Pipeline microbatches: forward of microbatches 0..k, then backward in any order (FFF-BBB,
1F1B, interleaved); the (layer, microbatch) key is first-class (accounting, errors)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")  # stashd.torch is optional: skip without torch

import stashd.torch as stash_torch
from stashd.torch import Key
from moe import make_params, moe_model

TOKENS, HIDDEN, FFN, EXPERTS, TOPK, LAYERS, MICROBATCHES = 64, 16, 16, 4, 2, 2, 3
STASHES_PER_LAYER = 5  # see torch_moe_test.py

ORDERS = {
    "fff-bbb": [2, 1, 0],     # all forwards, then backwards last-in first-out
    "1f1b": [0, 1, 2],        # each microbatch's backward as soon as the pipeline allows
    "interleaved": [1, 0, 2],
}


def microbatch_run(client, order, prefetch_depth=1):
    g = torch.Generator().manual_seed(1234)
    layers = [make_params(g, HIDDEN, FFN, EXPERTS) for _ in range(LAYERS)]
    xs = [torch.randn(TOKENS, HIDDEN, generator=g, dtype=torch.float64) for _ in
          range(MICROBATCHES)]
    outs = []
    for m, x in enumerate(xs):
        if client is None:
            outs.append(moe_model(x, layers, TOPK))
        else:
            with stash_torch.microbatch(m):
                outs.append(moe_model(x, layers, TOPK, client))
    for m in order:
        outs[m].sum().backward()
    return [t.grad for p in layers for t in p.tensors()]


@pytest.mark.parametrize("order", sorted(ORDERS))
def test_any_backward_order_is_bit_identical_with_per_microbatch_accounting(torch_client, order):
    stash_torch.set_prefetch(torch_client, depth=1)
    torch_client.begin_step(0)
    expected = microbatch_run(None, ORDERS[order])
    actual = microbatch_run(torch_client, ORDERS[order])
    assert all(torch.equal(e, a) for e, a in zip(expected, actual))
    acc = stash_torch.accounting(torch_client)
    assert sorted(acc) == [Key(layer, m) for layer in range(LAYERS) for m in range(MICROBATCHES)]
    for key, s in acc.items():
        assert (s.stashed, s.reloaded, s.live, s.overflowed) == (STASHES_PER_LAYER,
                                                                 STASHES_PER_LAYER, 0, 0), key
        assert s.bytes_stashed > 0
    stats = torch_client.stats()
    assert stats.stashes == stats.reloads == STASHES_PER_LAYER * LAYERS * MICROBATCHES
    assert stats.pages_live == 0


def test_accounting_starts_over_at_begin_step(torch_client):
    torch_client.begin_step(0)
    microbatch_run(torch_client, [0, 1, 2])
    assert stash_torch.accounting(torch_client)
    torch_client.begin_step(1)
    assert stash_torch.accounting(torch_client) == {}


def test_explicit_microbatch_wins_over_the_scope(torch_client):
    with stash_torch.microbatch(3):
        with stash_torch.stash_saved_tensors(torch_client, 64, 64) as inner:
            pass
        with stash_torch.stash_saved_tensors(torch_client, 64, 64, microbatch=5) as explicit:
            pass
    with stash_torch.stash_saved_tensors(torch_client, 64, 64) as outside:
        pass
    assert (inner.key, explicit.key, outside.key) == (Key(0, 3), Key(0, 5), Key(0, 0))
    with pytest.raises(ValueError, match="microbatch"):
        with stash_torch.microbatch(-1):
            pass


def test_a_stash_left_from_the_previous_step_does_not_unbalance_this_steps_accounting(
        torch_client):
    torch_client.begin_step(0)
    w = torch.randn(64, 8, requires_grad=True)
    with stash_torch.stash_saved_tensors(torch_client, 64, 64, layer=1) as ctx:
        out = (w * stash_torch.mark(torch.randn(64, 8))).sum()
    assert ctx.stashed == 1
    torch_client.begin_step(1)  # backward of step 0 runs late, after the step boundary
    out.backward()
    assert stash_torch.accounting(torch_client) == {}
    assert torch_client.stats().stashes_live == 0
