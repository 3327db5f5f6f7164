"""A small MoE block built from torch ops, shaped like Megatron's experts with TE GroupedLinear.

router (top-k) -> permute by expert into a static budget of max_tokens rows, every expert's
segment padded to 32 tokens (router padding for quantization) -> FC1 grouped linear -> SwiGLU ->
FC2 grouped linear -> unpermute weighted by the router probabilities.

What each piece saves for backward, and how it is marked, mirrors what the stash meets in
Megatron + TE (research/domain.md §1.2-1.3):
  * FC1 saves an MXFP8-like wgrad-only input: "columnwise data" x / s and a "columnwise
    scale_inv" s with one row per 32 tokens (s a power of two, so x / s * s == x exactly),
    marked with TE's attribute (False and True).
  * SwiGLU saves its input, which the layer registered by storage and then passed on through
    a `view` (the marker-losing reshape reviewers found in #6845).
  * FC2 saves its input, marked with stashd.torch.mark().
  * The unpermute multiply saves the permuted probabilities through a view ([:, None]); they
    are registered by storage.
Everything else (weights, router inputs, FC2's output) stays unmarked and in-process. All
arithmetic is float64 on the CPU and deterministic, so a run with the stash must equal a run
without it bit for bit.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional

import torch

import stashd.torch as stash_torch

BLOCK = 32  # router padding and MXFP8 scale block


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


class GroupedLinearFc1(torch.autograd.Function):
    """y[seg_e] = x[seg_e] @ w[e]; saves an MXFP8-like columnwise copy of x for wgrad."""

    @staticmethod
    def forward(ctx, x, w, splits: List[int]):
        max_tokens, hidden = x.shape
        y = x.new_zeros(max_tokens, w.shape[2])
        start = 0
        for e, n in enumerate(splits):
            y[start:start + n] = x[start:start + n] @ w[e]
            start += n
        blocks = x.detach().reshape(max_tokens // BLOCK, BLOCK, hidden)
        _, exponent = torch.frexp(blocks.abs().amax(dim=1))
        scale_inv = torch.ldexp(torch.ones_like(exponent, dtype=x.dtype), exponent)
        data = (blocks / scale_inv[:, None, :]).reshape(max_tokens, hidden)
        data.grouped_tensor_scale_inv = False      # TE: columnwise_data
        scale_inv.grouped_tensor_scale_inv = True  # TE: columnwise_scale_inv
        ctx.save_for_backward(data, scale_inv, w)
        ctx.splits = splits
        return y

    @staticmethod
    def backward(ctx, grad):
        data, scale_inv, w = ctx.saved_tensors
        max_tokens, hidden = data.shape
        x = (data.reshape(max_tokens // BLOCK, BLOCK, hidden) * scale_inv[:, None, :]).reshape(
            max_tokens, hidden)
        grad_x = grad.new_zeros(max_tokens, hidden)
        grad_w = torch.zeros_like(w)
        start = 0
        for e, n in enumerate(ctx.splits):
            seg = slice(start, start + n)
            grad_x[seg] = grad[seg] @ w[e].t()
            grad_w[e] = x[seg].t() @ grad[seg]
            start += n
        return grad_x, grad_w, None


class GroupedLinear(torch.autograd.Function):
    """y[seg_e] = x[seg_e] @ w[e]; saves x as it is (a high-precision input)."""

    @staticmethod
    def forward(ctx, x, w, splits: List[int]):
        y = x.new_zeros(x.shape[0], w.shape[2])
        start = 0
        for e, n in enumerate(splits):
            y[start:start + n] = x[start:start + n] @ w[e]
            start += n
        ctx.save_for_backward(x, w)
        ctx.splits = splits
        return y

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        grad_x = torch.zeros_like(x)
        grad_w = torch.zeros_like(w)
        start = 0
        for e, n in enumerate(ctx.splits):
            seg = slice(start, start + n)
            grad_x[seg] = grad[seg] @ w[e].t()
            grad_w[e] = x[seg].t() @ grad[seg]
            start += n
        return grad_x, grad_w, None


class SwiGlu(torch.autograd.Function):
    """h viewed as [tokens, 2, ffn] -> silu(h[:, 0]) * h[:, 1]; saves h (as given)."""

    @staticmethod
    def forward(ctx, h2):
        ctx.save_for_backward(h2)
        gate, up = h2[:, 0], h2[:, 1]
        return torch.nn.functional.silu(gate) * up

    @staticmethod
    def backward(ctx, grad):
        (h2,) = ctx.saved_tensors
        gate, up = h2[:, 0], h2[:, 1]
        sig = torch.sigmoid(gate)
        silu = gate * sig
        d_gate = grad * up * (sig * (1 + gate * (1 - sig)))
        d_up = grad * silu
        return torch.stack([d_gate, d_up], dim=1)


@dataclasses.dataclass
class MoeParams:
    router: torch.Tensor  # [hidden, experts]
    fc1: torch.Tensor     # [experts, hidden, 2 * ffn]
    fc2: torch.Tensor     # [experts, ffn, hidden]

    def tensors(self):
        return [self.router, self.fc1, self.fc2]


def make_params(generator: torch.Generator, hidden: int, ffn: int, experts: int) -> MoeParams:
    def param(*shape, scale):
        return (torch.randn(*shape, generator=generator, dtype=torch.float64) * scale
                ).requires_grad_()

    return MoeParams(router=param(hidden, experts, scale=hidden ** -0.5),
                     fc1=param(experts, hidden, 2 * ffn, scale=hidden ** -0.5),
                     fc2=param(experts, ffn, hidden, scale=ffn ** -0.5))


def max_tokens_for(tokens: int, topk: int, experts: int) -> int:
    """The static budget: every assignment plus worst-case padding, as HybridEP sizes it."""
    return round_up(tokens * topk + experts * (BLOCK - 1), BLOCK)


@dataclasses.dataclass
class LayerRecord:
    """What one layer's stash context saw (None when run without the stash)."""

    context: Optional[stash_torch.stash_saved_tensors]
    num_tokens: int
    max_tokens: int


def moe_layer(x: torch.Tensor, p: MoeParams, topk: int, client=None, *, layer: int = 0,
              zero_tail: bool = False, count_as_tensor: bool = True,
              records: Optional[List[LayerRecord]] = None) -> torch.Tensor:
    tokens, hidden = x.shape
    experts = p.router.shape[1]
    ffn = p.fc2.shape[1]
    max_tokens = max_tokens_for(tokens, topk, experts)

    probs = torch.softmax(x @ p.router, dim=-1)
    top_p, top_e = probs.topk(topk, dim=-1)  # [tokens, topk]

    # Permutation (index bookkeeping, no gradients): padded slot -> (token, k), pads -> a zero row.
    flat_e = top_e.reshape(-1)
    order = torch.argsort(flat_e, stable=True)
    counts = torch.bincount(flat_e, minlength=experts)
    padded = (counts + BLOCK - 1) // BLOCK * BLOCK          # tokens_per_expert after padding
    splits = [int(n) for n in padded]
    slot_assignment = torch.full((max_tokens,), tokens * topk, dtype=torch.long)
    start, taken = 0, 0
    for e in range(experts):
        n = int(counts[e])
        slot_assignment[start:start + n] = order[taken:taken + n]
        start += splits[e]
        taken += n
    num_tokens = start
    slot_of_assignment = torch.empty(tokens * topk, dtype=torch.long)
    real = slot_assignment < tokens * topk
    slot_of_assignment[slot_assignment[real]] = torch.nonzero(real).reshape(-1)

    x_rows = torch.cat([x, x.new_zeros(1, hidden)])
    p_rows = torch.cat([top_p.reshape(-1), top_p.new_zeros(1)])
    assignment_token = torch.cat([torch.arange(tokens).repeat_interleave(topk),
                                  torch.tensor([tokens])])
    x_perm = x_rows[assignment_token[slot_assignment]]          # [max_tokens, hidden]
    p_perm = p_rows[slot_assignment]                             # [max_tokens]

    def body():
        h = GroupedLinearFc1.apply(x_perm, p.fc1, splits)        # [max_tokens, 2 * ffn]
        stash_torch.register(h)                                  # survives the view below
        a = SwiGlu.apply(h.view(max_tokens, 2, ffn))
        stash_torch.mark(a)
        y = GroupedLinear.apply(a, p.fc2, splits)                # [max_tokens, hidden]
        stash_torch.register(p_perm)                             # saved as p_perm[:, None]
        return y * p_perm[:, None]

    if client is None:
        weighted = body()
        context = None
    else:
        count = padded.sum() if count_as_tensor else num_tokens  # tokens_per_expert.sum()
        context = stash_torch.stash_saved_tensors(client, max_tokens, count, name=f"moe{layer}",
                                                  layer=layer, zero_tail=zero_tail)
        with context:
            weighted = body()
    if records is not None:
        records.append(LayerRecord(context, num_tokens, max_tokens))

    out = weighted[slot_of_assignment].reshape(tokens, topk, hidden).sum(dim=1)
    return out


def moe_model(x: torch.Tensor, layers: List[MoeParams], topk: int, client=None,
              **kwargs) -> torch.Tensor:
    """Residual stack of MoE layers."""
    for i, p in enumerate(layers):
        x = x + moe_layer(x, p, topk, client, layer=i, **kwargs)
    return x
