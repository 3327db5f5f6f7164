"""Megatron-style MoE training with stashd: the README's example, runnable as written on a CPU.

    build/release/daemon/stashd --socket /tmp/stashd/stashd.sock &
    STASHD_SOCKET=/tmp/stashd/stashd.sock PYTHONPATH=client/python \
        python3 examples/python/megatron_moe.py --steps 3

A stack of MoE layers (router, token dispatcher, grouped experts, combine), shaped like
Megatron-LM's with Transformer Engine's GroupedLinear: the expert compute of each layer runs
inside stash_torch.stash_saved_tensors, the grouped linears mark what they save (as TE's
mark_grouped_tensor does), and the layer registers its permuted probabilities. Each step runs
under stash_torch.overflow_guard. With --check (the default) the same steps also run without
the stash, and the parameters must match bit for bit. Under torchrun, every rank connects to
the node's daemon with its own device (LOCAL_RANK); this example needs no process group.
"""

from __future__ import annotations

import argparse
import sys

import torch

import stashd
import stashd.torch as stash_torch

BLOCK = 32  # router padding for quantization: every expert's tokens padded to 32


class GroupedLinear(torch.autograd.Function):
    """y[seg_e] = x[seg_e] @ w[e] over the experts' padded segments; saves x for backward and
    marks it as TE's GroupedLinear does (grouped_tensor_scale_inv = False: token-major data)."""

    @staticmethod
    def forward(ctx, x, w, splits):
        y = x.new_zeros(x.shape[0], w.shape[2])
        start = 0
        for e, n in enumerate(splits):
            y[start:start + n] = x[start:start + n] @ w[e]
            start += n
        x.grouped_tensor_scale_inv = False  # TE: mark_grouped_tensor(x)
        ctx.save_for_backward(x, w)
        ctx.splits = splits
        return y

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        grad_x, grad_w = torch.zeros_like(x), torch.zeros_like(w)
        start = 0
        for e, n in enumerate(ctx.splits):
            seg = slice(start, start + n)
            grad_x[seg] = grad[seg] @ w[e].t()
            grad_w[e] = x[seg].t() @ grad[seg]
            start += n
        return grad_x, grad_w, None


class Router(torch.nn.Module):
    def __init__(self, hidden, experts, topk):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(hidden, experts, dtype=torch.float64) *
                                         hidden ** -0.5)
        self.topk = topk

    def forward(self, hidden):
        probs = torch.softmax(hidden @ self.weight, dim=-1)
        top_p, top_e = probs.topk(self.topk, dim=-1)
        return top_p, top_e


class Dispatcher:
    """Permutes token copies by expert into a static budget of max_tokens rows (each expert's
    segment padded to 32 tokens, HybridEP-style), and back."""

    def __init__(self, tokens, experts, topk):
        self.experts, self.topk = experts, topk
        self.max_tokens = -(-(tokens * topk + experts * (BLOCK - 1)) // BLOCK) * BLOCK

    def dispatch(self, hidden, top_p, top_e):
        tokens = hidden.shape[0]
        flat = top_e.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.experts)
        padded = (counts + BLOCK - 1) // BLOCK * BLOCK
        slots = torch.full((self.max_tokens,), tokens * self.topk, dtype=torch.long)
        start = taken = 0
        for e in range(self.experts):
            n = int(counts[e])
            slots[start:start + n] = order[taken:taken + n]
            start += int(padded[e])
            taken += n
        self.slots = slots
        rows = torch.cat([hidden.repeat_interleave(self.topk, dim=0),
                          hidden.new_zeros(1, hidden.shape[1])])
        probs = torch.cat([top_p.reshape(-1), top_p.new_zeros(1)])
        return rows[slots], padded, probs[slots]

    def combine(self, out, tokens):
        real = self.slots < tokens * self.topk
        back = out.new_zeros(tokens * self.topk, out.shape[1])
        back = back.index_add(0, self.slots[real], out[real])
        return back.reshape(tokens, self.topk, -1).sum(dim=1)


class GroupedMLP(torch.nn.Module):
    def __init__(self, hidden, ffn, experts):
        super().__init__()
        self.fc1 = torch.nn.Parameter(torch.randn(experts, hidden, ffn, dtype=torch.float64) *
                                      hidden ** -0.5)
        self.fc2 = torch.nn.Parameter(torch.randn(experts, ffn, hidden, dtype=torch.float64) *
                                      ffn ** -0.5)

    def forward(self, permuted, tokens_per_expert, permuted_probs):
        splits = [int(n) for n in tokens_per_expert]
        h = GroupedLinear.apply(permuted, self.fc1, splits)
        a = torch.nn.functional.gelu(h)                   # saves h (unmarked: stays here)
        y = GroupedLinear.apply(a, self.fc2, splits)
        return y * permuted_probs[:, None]                # saves the probs through a view


class MoELayer(torch.nn.Module):
    def __init__(self, layer_number, tokens, hidden, ffn, experts, topk, client):
        super().__init__()
        self.layer_number = layer_number
        self.router = Router(hidden, experts, topk)
        self.dispatcher = Dispatcher(tokens, experts, topk)
        self.experts = GroupedMLP(hidden, ffn, experts)
        self.client = client  # None: no stash (the reference run)

    def forward(self, hidden):
        probs, routing_map = self.router(hidden)
        permuted, tokens_per_expert, permuted_probs = self.dispatcher.dispatch(
            hidden, probs, routing_map)
        if self.client is None:
            out = self.experts(permuted, tokens_per_expert, permuted_probs)
        else:
            # --- the README's example ---------------------------------------------------
            max_tokens = permuted.shape[0]      # the static budget (HybridEP num_permuted_tokens)
            with stash_torch.stash_saved_tensors(self.client, max_tokens,
                                                 tokens_per_expert.sum(), name="experts",
                                                 layer=self.layer_number):
                stash_torch.register(permuted_probs)      # survives view/reshape/detach
                out = self.experts(permuted, tokens_per_expert, permuted_probs)
        return hidden + self.dispatcher.combine(out, hidden.shape[0])


def build(client, args, seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[
        MoELayer(i, args.tokens, args.hidden, args.ffn, args.experts, args.topk, client)
        for i in range(args.layers)])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--ffn", type=int, default=64)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="skip the reference run without the stash")
    args = p.parse_args(argv)

    # The daemon: $STASHD_SOCKET or the default socket; the device: LOCAL_RANK or the current
    # CUDA device (each rank of a node gets its own pool).
    client = stashd.connect(label="megatron-moe-example")
    model = build(client, args, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    reference = build(None, args, seed=0) if args.check else None
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.01) if args.check else None
    guard = stash_torch.overflow_guard(client,
                                       on_rerun=lambda: optimizer.zero_grad(set_to_none=True))
    data = torch.Generator().manual_seed(1)
    reran = 0
    for step in range(args.steps):
        batch = torch.randn(args.tokens, args.hidden, generator=data, dtype=torch.float64)
        optimizer.zero_grad(set_to_none=True)
        result = guard.run(step, lambda: model(batch).pow(2).mean().backward())
        reran += result.reran             # an overflow reran the step with the stash off
        optimizer.step()
        if reference is not None:
            ref_optimizer.zero_grad(set_to_none=True)
            reference(batch).pow(2).mean().backward()
            ref_optimizer.step()
    try:
        # The live session's counters: after a daemon restart mid-run, the new session's.
        stats = client.stats()
        print(f"{args.steps} steps, {args.layers} layers: {stats.stashes} stashes, "
              f"{stats.reloads} reloads, {stats.overflows} overflows, {reran} reruns")
    except stashd.StashError as e:  # no session right now: the daemon is gone or drained
        print(f"{args.steps} steps, {args.layers} layers: no stats ({e}), {reran} reruns")
    if reference is not None:
        for (name, a), (_, b) in zip(model.named_parameters(), reference.named_parameters()):
            if not torch.equal(a, b):
                print(f"parity FAILED: {name} differs from the run without the stash")
                return 1
        print("parity OK: parameters bit-identical to the run without the stash")
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
