"""Activation checkpointing with the stash: every combination of the README's table."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")  # stashd.torch is optional: skip without torch

import stashd.torch as stash_torch
from torch.utils.checkpoint import checkpoint

M, H = 64, 8


def experts(client, x, w):
    """The stash context inside the checkpointed region: 2 marked saves."""
    with stash_torch.stash_saved_tensors(client, M, M, name="experts") as ctx:
        a = stash_torch.mark(x * w)
        b = stash_torch.mark(x + w)
        out = torch.tanh(a * b)
    experts.contexts.append(ctx)
    return out


def plain(x, w):
    return torch.tanh((x * w) * (x + w))


def inputs():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(M, H, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(M, H, generator=g, dtype=torch.float64, requires_grad=True)
    return x, w


def reference():
    x, w = inputs()
    plain(x, w).sum().backward()
    return x.grad, w.grad


@pytest.mark.parametrize("reentrant", [True, False])
def test_context_inside_a_checkpoint_never_stashes_and_grads_are_exact(torch_client, reentrant):
    experts.contexts = []
    x, w = inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("error", stash_torch.StashWarning)  # no "stashed nothing"
        out = checkpoint(lambda x, w: experts(torch_client, x, w), x, w,
                         use_reentrant=reentrant)
        out.sum().backward()
    assert torch.equal(x.grad, reference()[0]) and torch.equal(w.grad, reference()[1])
    forward, recompute = experts.contexts
    # Reentrant: forward runs under no_grad (nothing is saved); non-reentrant: the checkpoint's
    # hooks keep working (the context installs none). The recompute in backward is skipped.
    assert forward.skipped == ("no_grad" if reentrant else "in_checkpoint")
    assert recompute.skipped == "recompute"
    assert forward.stashed == recompute.stashed == 0
    counters = stash_torch.counters(torch_client)
    assert counters["recompute_skipped"] == 1 and counters.get("empty_contexts", 0) == 0
    assert torch_client.stats().stashes == 0


def test_non_reentrant_checkpoint_still_recomputes_inside_a_context_region(torch_client):
    # The checkpoint must really drop the region's activations: count the recompute.
    experts.contexts = []
    x, w = inputs()
    checkpoint(lambda x, w: experts(torch_client, x, w), x, w,
               use_reentrant=False).sum().backward()
    assert len(experts.contexts) == 2  # forward + the recompute in backward


@pytest.mark.parametrize("reentrant", [True, False])
def test_context_around_a_checkpoint_sees_nothing_and_says_so(torch_client, reentrant):
    x, w = inputs()
    with pytest.warns(stash_torch.StashWarning, match="stashed none|saw no marked"):
        with stash_torch.stash_saved_tensors(torch_client, M, M, name="outer") as ctx:
            out = checkpoint(plain, x, w, use_reentrant=reentrant)
    out.sum().backward()
    assert ctx.stashed == 0
    assert torch.equal(x.grad, reference()[0]) and torch.equal(w.grad, reference()[1])


def test_without_checkpoint_the_phase_is_normal():
    assert stash_torch.phase() == stash_torch.Phase.NORMAL
    with torch.no_grad():
        assert stash_torch.phase() == stash_torch.Phase.NO_GRAD
