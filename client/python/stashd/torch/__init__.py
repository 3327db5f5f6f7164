"""PyTorch integration: marked saved activations go to the daemon in forward, come back in backward.

    import stashd
    import stashd.torch as stash_torch

    client = stashd.connect()
    with stash_torch.stash_saved_tensors(client, max_tokens, tokens_per_expert.sum(),
                                         name="experts", layer=layer_number):
        out = experts(permuted_hidden)           # GroupedLinear etc. mark what they save
    out.backward(grad)                           # stashed activations come back here

`stash_saved_tensors` installs `torch.autograd.graph.saved_tensors_hooks` for the duration of
one layer. The pack hook takes a saved tensor only when it is *marked*; everything else, 0-dim
and empty tensors included, passes through untouched, exactly as Megatron's paged stash does.
A tensor is marked when:

  * it carries Transformer Engine's attribute `grouped_tensor_scale_inv` (set by TE's
    `mark_grouped_tensor`): False = token-major data, `max_tokens` rows; True = an MXFP8
    columnwise scale_inv, one row per 32 tokens: ceil(max_tokens / 32) rows, or that rounded
    up to a multiple of 4 (TE's allocation);
  * or `mark(t)` gave it stashd's own attribute (same meaning, immune to a TE rename);
  * or `register(t)` recorded its storage (storage pointer, byte offset, byte size) with the
    active context. Python attributes live on one tensor object and `view`, `reshape`,
    `detach` (and activation recompute's `detach_variable`) drop them; storage registration
    still matches the contiguous aliases they produce, for as long as the storage lives.

A marked tensor is split into rows and only the prefix of valid rows is stashed: num_tokens
rows of data, ceil(num_tokens / 32) rows of a scale_inv. In the host-backend path the pack hook
copies that prefix into a pooled shared-memory staging Buffer (a strided tensor is first made
contiguous: one more copy), asks the daemon to stash it and waits for the confirmation; the
hook then hands autograd a small StashedTensor, so the activation's memory is freed. When the
daemon answers OVERFLOW (pool and host tier full, or a count beyond max_tokens), nothing was
taken: the hook returns the tensor itself and the step flag `overflow` is set. When the daemon
cannot be reached, the same happens and the step flag `unavailable` is set (a warning says so
once): forward goes on, only the memory saving is lost.

The unpack hook reloads the rows into a fresh tensor of the saved shape, dtype and device;
with prefetch (default depth 1, `set_prefetch`) the reloads of a (layer, microbatch) group
and the next group in schedule order start when backward reaches the group, so the unpack only
waits for them. Rows past the valid prefix are zeros with zero_tail=True and uninitialised
otherwise (Megatron's default). A handle autograd drops unread releases its stash;
`flush(client)` waits for those releases. Unpacking twice (retain_graph=True) reloads once.

With a client on the cuda backend (`stashd.connect(backend="cuda")`), CUDA tensors take the
sync-free path instead: no staging, no `.item()`, no host copy of the count, and the trainer's
thread never waits for a copy (see client/python/README.md).

`connect(...)` is `stashd.connect(...)` in the group of the job's sessions on this node: the
group given, or $STASHD_GROUP, else one named after the torchrun or Slurm job with a secret rank 0
draws and broadcasts over the default process group (a collective: call it on every rank at the
same point, after init_process_group; without torch.distributed no group is formed). See
stashd/torch/group.py.

Modules: marking (markers, row geometry), context (stash_saved_tensors, register), handle
(StashedTensor), state (per-client state, flush, counters), prefetch, microbatch (keys and
accounting), checkpointing (recompute detection), hook_errors (the original exceptions),
overflow_guard (all-reduce the step flags and rerun), group (connect in the job's group).
"""

from stashd.torch.checkpointing import Phase, phase
from stashd.torch.context import CountLike, register, stash_saved_tensors
from stashd.torch.group import connect, job_group, launcher_group_name
from stashd.torch.handle import StashedTensor
from stashd.torch.hook_errors import last_error, unwrap_errors
from stashd.torch.marking import (SCALE_INV_BLOCK_TOKENS, STASHD_MARKER_ATTRIBUTE,
                                  TE_MARKER_ATTRIBUTE, TE_SCALE_ROW_PADDING, as_tensor, mark,
                                  marker)
from stashd.torch.microbatch import Key, KeyStats, microbatch
from stashd.torch.overflow_guard import StepResult, overflow_guard
from stashd.torch.state import (StashWarning, accounting, counters, empty_cache, flush, prefetch,
                                set_prefetch)
from stashd.torch.state import _TorchState  # noqa: F401  (the per-client state, for tests)

__all__ = [
    "CountLike",
    "Key",
    "KeyStats",
    "Phase",
    "SCALE_INV_BLOCK_TOKENS",
    "STASHD_MARKER_ATTRIBUTE",
    "StashWarning",
    "StashedTensor",
    "StepResult",
    "TE_MARKER_ATTRIBUTE",
    "TE_SCALE_ROW_PADDING",
    "accounting",
    "as_tensor",
    "connect",
    "counters",
    "empty_cache",
    "flush",
    "job_group",
    "last_error",
    "launcher_group_name",
    "mark",
    "marker",
    "microbatch",
    "overflow_guard",
    "phase",
    "prefetch",
    "register",
    "set_prefetch",
    "stash_saved_tensors",
    "unwrap_errors",
]
