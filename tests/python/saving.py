"""A tensor saved for backward through stashd.torch and handed back: the round trip the
marking and defect tests check."""

from __future__ import annotations

import torch

import stashd.torch as stash_torch

M = 64  # max tokens


class Save(torch.autograd.Function):
    """Saves `t` for backward and appends what backward gets back to `sink`."""

    @staticmethod
    def forward(ctx, t, anchor, sink):
        ctx.save_for_backward(t)
        ctx.sink = sink
        return anchor.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.sink.append(ctx.saved_tensors[0])
        return None, grad, None


def save_and_reload(client, t, *, max_tokens=M, num_tokens=M, **kwargs):
    sink = []
    anchor = torch.ones(1, requires_grad=True)
    with stash_torch.stash_saved_tensors(client, max_tokens, num_tokens, **kwargs) as ctx:
        out = Save.apply(t, anchor, sink)
    out.sum().backward()
    assert len(sink) == 1
    return sink[0], ctx
