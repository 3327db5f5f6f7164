"""The PyTorch path on a GPU (check.sh step "torch-cuda"): stashd.torch with a cuda-backend
client, against a running `stashd --backend=cuda`.

A small stack of linear layers on CUDA whose saved inputs are marked; each step runs once
without the stash and once with it, and the output and every gradient must be equal bit for bit.
The count of valid rows is a CUDA tensor (the sync-free path: the copy kernel reads it), rows past
it are zero in the inputs, and reloads use zero_tail, so the two runs see the same bits.

--mode mapped runs it in mapped mode (check.sh step "torch-cuda-mapped"): the library's kernels
page the saved inputs into chunks leased to this process, on PyTorch's current stream, and the
step's flags must show no overflow (an overflowed stash's backward would read stale rows).

Usage: python3 torch_cuda_check.py [--steps N] [--cpu] [--mode daemon-copy|mapped]
(STASHD_SOCKET names the daemon;
PYTHONPATH and STASHD_CLIENT_LIB point at the package and libstash_client.so, as check.sh sets
them). --cpu runs the same check on CPU tensors against a host-backend daemon, so that the script
itself is tested where there is no GPU (tests/python runs it so).
Exit status 0 when parity holds and the daemon holds nothing at the end; 1 otherwise, a torch that
is installed but fails to import included; 2 when this machine has no torch module or a torch
without CUDA (check.sh reports a skip).
"""

from __future__ import annotations

import argparse
import os
import sys

MAX_TOKENS = 4096
HIDDEN = 1024
LAYERS = 4


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--cpu", action="store_true",
                        help="CPU tensors and a host-backend daemon (tests the script itself)")
    parser.add_argument("--mode", choices=("daemon-copy", "mapped"), default="daemon-copy")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--hidden", type=int, default=HIDDEN)
    args = parser.parse_args()
    try:
        import torch
    except ModuleNotFoundError as e:
        if e.name != "torch":  # torch is there but needs a module that is not
            print(f"torch-cuda: import torch failed: {e!r}")
            return 1
        print("torch-cuda: no torch on this machine")
        return 2
    except Exception as e:  # noqa: BLE001 - torch is there and fails to load: a failure, not a skip
        print(f"torch-cuda: import torch failed: {e!r}")
        return 1
    if not args.cpu and not torch.cuda.is_available():
        print("torch-cuda: torch sees no CUDA device")
        return 2
    # Identical bits in both runs: no TF32, deterministic cuBLAS.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.use_deterministic_algorithms(True)

    import stashd
    import stashd.torch as stash_torch

    class MarkedLinear(torch.autograd.Function):
        """y = x @ w, saving x (marked by the caller) and w for backward."""

        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x @ w

        @staticmethod
        def backward(ctx, grad):
            x, w = ctx.saved_tensors
            return grad @ w.t(), x.t() @ grad

    max_tokens, hidden = args.max_tokens, args.hidden
    device = torch.device("cpu") if args.cpu else torch.device("cuda", 0)
    generator = torch.Generator(device="cpu").manual_seed(1234)
    weights = [(torch.randn(hidden, hidden, generator=generator) * hidden ** -0.5)
               .to(device).requires_grad_() for _ in range(LAYERS)]

    def run(x0, valid, client=None):
        for w in weights:
            w.grad = None
        x = x0.clone().requires_grad_()
        h = x
        contexts = []
        for w in weights:
            if client is None:
                h = torch.relu(MarkedLinear.apply(h, w))
            else:
                ctx = stash_torch.stash_saved_tensors(client, max_tokens, valid, zero_tail=True)
                with ctx:
                    stash_torch.mark(h)
                    h = torch.relu(MarkedLinear.apply(h, w))
                contexts.append(ctx)
        h.sum().backward()
        if client is not None:
            stash_torch.flush(client)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return h.detach(), [x.grad] + [w.grad.clone() for w in weights], contexts

    client = stashd.connect(backend="host" if args.cpu else "cuda", device=0, mode=args.mode,
                            label="torch-cuda-check")
    failures = 0
    stashes = 0
    for step in range(args.steps):
        client.begin_step(step)
        rows = max_tokens * 3 // 4 + 32 * step
        x0 = torch.randn(max_tokens, hidden, generator=generator).to(device)
        x0[rows:] = 0  # rows past the valid ones are zero, as after router padding
        valid = torch.tensor([rows], device=device, dtype=torch.int32)  # not int64 on purpose
        want_out, want_grads, _ = run(x0, None)
        got_out, got_grads, contexts = run(x0, valid, client)
        if not torch.equal(want_out, got_out):
            print(f"torch-cuda: step {step}: the forward output differs")
            failures += 1
        for i, (w, g) in enumerate(zip(want_grads, got_grads)):
            if not torch.equal(w, g):
                print(f"torch-cuda: step {step}: gradient {i} differs "
                      f"(max abs diff {(w - g).abs().max().item()})")
                failures += 1
        stashes += sum(c.stashed for c in contexts)
        overflowed = sum(c.overflowed for c in contexts)
        if client.step_flags().overflow:  # flush synchronized the stream (mapped mode on cuda)
            print(f"torch-cuda: step {step}: the step's overflow flag is set: the lease was too "
                  f"small for {LAYERS} x {max_tokens} x {hidden} activations")
            failures += 1
        print(f"torch-cuda: step {step}: {rows}/{max_tokens} rows, "
              f"{sum(c.stashed for c in contexts)} stashed, {overflowed} overflowed")
    if args.mode == "mapped":
        client.begin_step(args.steps)  # a step boundary publishes the session's books
        if device.type == "cuda":
            torch.cuda.synchronize()
    stats = client.stats()
    if stats.stashes_live != 0 or stats.pages_live != 0:
        print(f"torch-cuda: the daemon still holds {stats.stashes_live} stashes "
              f"({stats.pages_live} pages) after every backward")
        failures += 1
    stash_torch.empty_cache(client)
    client.close()
    if stashes == 0:
        print("torch-cuda: nothing was stashed")
        failures += 1
    print(f"torch-cuda ({args.mode}): {'parity OK' if failures == 0 else 'FAILED'} over "
          f"{args.steps} steps, "
          f"{stashes} stashes; daemon: {stats.stashes} stashes, {stats.reloads} reloads, "
          f"{stats.bytes_stashed} bytes")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
