"""Prefetch: entering a (layer, microbatch) group in backward starts the reloads of the rest of
that group and of the next groups in schedule order; unpack then only waits for them."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")  # stashd.torch is optional: skip without torch

import stashd
import stashd.torch as stash_torch
from stashd.torch import Key

M, H, LAYERS = 64, 8, 4


class Probe(torch.autograd.Function):
    """Identity whose backward records stash_torch.accounting() when backward passes it."""

    @staticmethod
    def forward(ctx, x, client, seen):
        ctx.client, ctx.seen = client, seen
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.seen.append(stash_torch.accounting(ctx.client))
        return grad, None, None


def stack(client, x, weights, *, microbatch=0, probe=None):
    """LAYERS layers of h = tanh((h * w) * (h + w)); the two factors are marked and saved by
    the product, so each layer stashes 2 tensors."""
    h = x
    for layer, w in enumerate(weights):
        with stash_torch.stash_saved_tensors(client, M, M, layer=layer, microbatch=microbatch):
            a = stash_torch.mark(h * w)
            b = stash_torch.mark(h + w)
            h = torch.tanh(a * b)
        if probe is not None:
            h = Probe.apply(h, client, probe)
    return h


def make(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, H, generator=g, dtype=torch.float64, requires_grad=True)
    ws = [torch.randn(M, H, generator=g, dtype=torch.float64, requires_grad=True)
          for _ in range(LAYERS)]
    return x, ws


def grads(client, seed, **kwargs):
    x, ws = make(seed)
    stack(client, x, ws, **kwargs).sum().backward() if client is not None else \
        _plain(x, ws).sum().backward()
    return [x.grad] + [w.grad for w in ws]


def _plain(x, ws):
    h = x
    for w in ws:
        h = torch.tanh((h * w) * (h + w))
    return h


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_prefetch_keeps_gradients_bit_identical(torch_client, depth):
    stash_torch.set_prefetch(torch_client, depth=depth)
    torch_client.begin_step(0)
    expected = grads(None, 7)
    actual = grads(torch_client, 7)
    assert all(torch.equal(e, a) for e, a in zip(expected, actual))
    acc = stash_torch.accounting(torch_client)
    assert sorted(acc) == [Key(layer, 0) for layer in range(LAYERS)]
    for key, s in acc.items():
        assert (s.stashed, s.reloaded, s.live) == (2, 2, 0), key
        assert s.prefetched == (0 if depth == 0 else 2), key
    stats = torch_client.stats()
    assert stats.reloads == stats.stashes == 2 * LAYERS and stats.pages_live == 0


def test_next_layer_is_reloading_before_its_backward_starts(torch_client):
    stash_torch.set_prefetch(torch_client, depth=1)
    torch_client.begin_step(0)
    x, ws = make(3)
    seen = []
    stack(torch_client, x, ws, probe=seen).sum().backward()
    # The probe after layer L runs before layer L's backward. At the probe of layer 2, layer 3's
    # backward is done: its first unpack started layer 2's reloads (depth 1), not layer 1's.
    at_layer_2 = seen[1]
    assert at_layer_2[Key(3, 0)].reloaded == 2
    assert at_layer_2[Key(2, 0)].prefetched == 2 and at_layer_2[Key(2, 0)].reloaded == 0
    assert at_layer_2[Key(1, 0)].prefetched == 0


def test_depth_two_keeps_reloads_two_groups_ahead_not_more(torch_client):
    # Issue 21: reloads already started count toward the depth. Before, every group entered
    # started `depth` more groups past those already reloading, so they ran ever further ahead.
    layers = 8
    stash_torch.set_prefetch(torch_client, depth=2)
    torch_client.begin_step(0)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(M, H, generator=g, dtype=torch.float64, requires_grad=True)
    ws = [torch.randn(M, H, generator=g, dtype=torch.float64, requires_grad=True)
          for _ in range(layers)]
    seen = []
    stack(torch_client, x, ws, probe=seen).sum().backward()
    # seen[i] is taken right before layer (layers - 1 - i)'s backward: the group above it was
    # entered last and started the next two groups, no further.
    for i in range(1, layers - 2):
        below = layers - 1 - i
        acc = seen[i]
        assert acc[Key(below, 0)].prefetched == 2, (i, acc[Key(below, 0)])
        assert acc[Key(below - 1, 0)].prefetched == 2, (i, acc[Key(below - 1, 0)])
        if below - 2 >= 0:
            assert acc[Key(below - 2, 0)].prefetched == 0, (i, acc[Key(below - 2, 0)])


def test_depth_two_stays_two_groups_ahead_in_an_interleaved_schedule(torch_client):
    # Issue 21's case: an interleaved (virtual pipeline) schedule, whose backward alternates
    # microbatches chunk by chunk, used to start ever more reloads ahead (2, 3, ... groups),
    # since groups whose reload had started no longer counted toward the depth. Four model
    # chunks of two layers, two microbatches, backward in the schedule's order: at every point
    # at most `depth` groups are reloading without having been read by backward yet.
    chunks, per_chunk = 4, 2
    schedule = [(c * per_chunk + i, m) for c in reversed(range(chunks)) for m in (0, 1)
                for i in reversed(range(per_chunk))]
    stash_torch.set_prefetch(torch_client, depth=2, schedule=schedule)
    torch_client.begin_step(0)
    g = torch.Generator().manual_seed(12)
    seen = []
    inputs, outputs = [], []  # per microbatch, per chunk
    for m in (0, 1):
        h = torch.randn(M, H, generator=g, dtype=torch.float64, requires_grad=True)
        ins, outs = [], []
        for c in range(chunks):
            h = h.detach().requires_grad_()  # a pipeline stage's input
            ins.append(h)
            for i in range(per_chunk):
                w = torch.randn(M, H, generator=g, dtype=torch.float64)
                with stash_torch.stash_saved_tensors(torch_client, M, M, layer=c * per_chunk + i,
                                                     microbatch=m):
                    a = stash_torch.mark(h * w)
                    b = stash_torch.mark(h + w)
                    h = torch.tanh(a * b)
                h = Probe.apply(h, torch_client, seen)
            outs.append(h)
        inputs.append(ins)
        outputs.append(outs)
    for c in reversed(range(chunks)):
        for m in (0, 1):
            if c == chunks - 1:
                outputs[m][c].sum().backward()
            else:
                outputs[m][c].backward(inputs[m][c + 1].grad)
    assert len(seen) == chunks * per_chunk * 2
    most = 0
    for i, acc in enumerate(seen):
        ahead = sorted(k for k, s in acc.items() if s.prefetched > 0 and s.reloaded == 0)
        assert len(ahead) <= 2, (i, ahead)
        most = max(most, len(ahead))
    assert most == 2, "the prefetcher ran that far ahead at some point"
    acc = stash_torch.accounting(torch_client)
    assert all(s.live == 0 and s.reloaded == 2 for s in acc.values())


def test_schedule_order_prefetches_across_microbatches(torch_client):
    # 1F1B-like: microbatch 1's backward runs right after microbatch 0's.
    stash_torch.set_prefetch(torch_client, depth=1, schedule=[
        (layer, m) for m in (0, 1) for layer in reversed(range(LAYERS))])
    torch_client.begin_step(0)
    runs = []
    for m in (0, 1):
        x, ws = make(10 + m)
        seen = []
        out = stack(torch_client, x, ws, microbatch=m, probe=seen)
        runs.append((out, seen))
    runs[0][0].sum().backward()
    acc = stash_torch.accounting(torch_client)
    # Microbatch 0's last group (layer 0) prefetched microbatch 1's first (layer 3).
    assert acc[Key(3, 1)].prefetched == 2 and acc[Key(3, 1)].reloaded == 0
    assert acc[Key(2, 1)].prefetched == 0
    runs[1][0].sum().backward()
    acc = stash_torch.accounting(torch_client)
    assert all(s.live == 0 and s.reloaded == 2 for s in acc.values())


def test_explicit_prefetch_of_an_unknown_key_names_layer_and_microbatch(torch_client):
    x, ws = make(1)
    out = stack(torch_client, x, ws, microbatch=4)
    assert stash_torch.prefetch(torch_client, layer=2, microbatch=4) == 2
    with pytest.raises(stashd.StashError, match="layer 2 microbatch 3 was never stashed"):
        stash_torch.prefetch(torch_client, layer=2, microbatch=3)
    out.sum().backward()
    assert stash_torch.accounting(torch_client)[Key(2, 4)].reloaded == 2


def test_prefetched_stash_dropped_unread_returns_its_pages(torch_client):
    x, ws = make(2)
    out = stack(torch_client, x, ws)
    stash_torch.prefetch(torch_client, layer=0)
    del out  # the graph goes with reloads in flight
    stash_torch.flush(torch_client)
    stats = torch_client.stats()
    assert stats.stashes_live == 0 and stats.pages_live == 0


def test_bad_depth_is_rejected(torch_client):
    with pytest.raises(ValueError, match="depth"):
        stash_torch.set_prefetch(torch_client, depth=-1)
