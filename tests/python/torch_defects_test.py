"""Issue 14's silent failures of stashd.torch, one test each (each failed before the fix)."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")  # stashd.torch is optional: skip without torch

import stashd
import stashd.torch as stash_torch
from saving import save_and_reload
from stashd.connect import default_device

M = 64  # max tokens
H = 8


# --- 1. register() holds the storage, not the Python object -------------------------------

def test_registering_a_temporary_view_matches_while_the_storage_lives(torch_client):
    a = torch.randn(M, H, requires_grad=True)
    with stash_torch.stash_saved_tensors(torch_client, M, M) as cm:
        b = a * 1.0
        stash_torch.register(b.view(-1))  # the view dies at once; b's storage lives on
        y = b.sin()                       # sin saves b
    y.sum().backward()
    assert cm.stashed == 1
    assert torch.equal(a.grad, torch.cos(a.detach()))


class RegisterLocal(torch.autograd.Function):
    """Registers a temporary view of a local inside forward; torch 1.13 packs after forward."""

    @staticmethod
    def forward(ctx, x):
        h = x * 2
        stash_torch.register(h.reshape(-1))
        ctx.save_for_backward(h)
        return h.sum(dim=1)

    @staticmethod
    def backward(ctx, grad):
        (h,) = ctx.saved_tensors
        return grad[:, None] * h


def test_registering_inside_an_autograd_function_forward_is_stashed(torch_client):
    x = torch.randn(M, H, requires_grad=True)
    with stash_torch.stash_saved_tensors(torch_client, M, M) as cm:
        out = RegisterLocal.apply(x)
    out.sum().backward()
    assert cm.stashed == 1
    assert torch.equal(x.grad, 2 * x.detach())


# --- 2. a marked tensor with a last stride other than 1 -----------------------------------

def test_marked_column_slice_is_made_contiguous_and_stashed(torch_client):
    p = torch.randn(M, 3)
    q = stash_torch.mark((p * 1.0)[:, 0])  # stride (3,): cannot be viewed as bytes
    assert q.stride(-1) != 1
    got, ctx = save_and_reload(torch_client, q)
    assert ctx.stashed == 1 and torch.equal(got, q)


# --- 3. a context that stashes nothing says so, once, and counts it -----------------------

def test_context_that_stashes_nothing_warns_once_naming_it_and_counts(torch_client):
    x = torch.randn(M, H, requires_grad=True)
    permuted = torch.randn(M, H)
    with pytest.warns(stash_torch.StashWarning, match=r"'experts' \(layer 3 microbatch 0\).*"
                      r"1 register\(\) call"):
        with stash_torch.stash_saved_tensors(torch_client, M, M, name="experts", layer=3):
            stash_torch.register(permuted)
            # Per-expert slicing: the saved tensors are slices, never the registered bytes.
            out = sum((x[i:i + 16] * permuted[i:i + 16]).sum() for i in range(0, M, 16))
    out.backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error", stash_torch.StashWarning)  # the second one is silent
        with stash_torch.stash_saved_tensors(torch_client, M, M, name="experts", layer=3):
            (x * 2).sum().backward()
    with pytest.warns(stash_torch.StashWarning, match=r"'router' .*saw no marked"):
        with stash_torch.stash_saved_tensors(torch_client, M, M, name="router"):
            (x * x).sum().backward()
    assert stash_torch.counters(torch_client)["empty_contexts"] == 3
    assert torch_client.stats().stashes == 0


# --- 4. each rank on its own device by default --------------------------------------------

def test_connect_defaults_to_local_rank(start_daemon, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert default_device() == 1
    one = start_daemon("--devices=1", "--pool-bytes=4MiB", "--page-bytes=64KiB")
    with pytest.raises(stashd.StashError, match="device"):
        one.connect()  # device 1 does not exist there: proof that LOCAL_RANK was used
    two = start_daemon("--devices=2", "--pool-bytes=4MiB", "--page-bytes=64KiB")
    with two.connect() as c:
        assert c.stats().pool_pages_total > 0
    monkeypatch.delenv("LOCAL_RANK")
    assert default_device() == 0
    monkeypatch.setenv("LOCAL_RANK", "x")
    with pytest.raises(ValueError, match="LOCAL_RANK"):
        default_device()


# --- 5. a partial last block of 32 tokens keeps its scale row -----------------------------

@pytest.mark.parametrize("count_as_tensor", [False, True])
def test_scale_inv_rows_are_ceil_of_tokens_over_32(torch_client, count_as_tensor):
    t = stash_torch.mark(torch.arange(2 * 16, dtype=torch.uint8).reshape(2, 16) + 1,
                         scale_inv=True)
    n = torch.tensor(40) if count_as_tensor else 40
    got, ctx = save_and_reload(torch_client, t, max_tokens=64, num_tokens=n, zero_tail=True)
    assert ctx.stashed == 1
    assert torch.equal(got, t)  # tokens 32..39 have the second row: it came back
    assert torch_client.stats().bytes_stashed == 2 * 16


# --- 6. TE pads columnwise scale_inv rows to a multiple of 4 ------------------------------

def test_te_padded_scale_inv_shape_is_accepted(torch_client):
    # max_tokens = 96: 3 scale rows, allocated by TE as 4.
    t = stash_torch.mark(torch.arange(4 * 128, dtype=torch.int32).reshape(4, 128).to(
        torch.uint8), scale_inv=True)
    got, ctx = save_and_reload(torch_client, t, max_tokens=96, num_tokens=96, zero_tail=True)
    assert ctx.stashed == 1
    assert torch.equal(got[:3], t[:3]) and not got[3:].any()  # the padding row is not valid


def test_te_padded_scale_inv_rows_come_from_the_shape_not_the_bytes(torch_client):
    # [4, 96] must be 4 rows of 96 bytes, not 3 rows of 128.
    t = stash_torch.mark(torch.arange(4 * 96, dtype=torch.int32).reshape(4, 96).to(
        torch.uint8), scale_inv=True)
    got, ctx = save_and_reload(torch_client, t, max_tokens=96, num_tokens=64, zero_tail=True)
    assert ctx.stashed == 1
    assert torch.equal(got[:2], t[:2]) and not got[2:].any()
    assert torch_client.stats().bytes_stashed == 2 * 96


# --- 7. errors in hooks reach the trainer as themselves -----------------------------------

def test_forward_hook_error_is_the_original_exception(torch_client):
    bad = stash_torch.mark(torch.ones(M + 1, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="does not split into 64 rows") as info:
        save_and_reload(torch_client, bad)
    assert isinstance(info.value.__cause__, RuntimeError)  # what PyTorch raised, chained
    assert stash_torch.last_error() is info.value


def test_backward_hook_error_is_a_stash_error_naming_layer_and_microbatch(torch_client):
    t = stash_torch.mark(torch.randn(M, H))
    w = torch.randn(M, H, requires_grad=True)
    stash_torch.set_prefetch(torch_client, depth=0)
    with stash_torch.stash_saved_tensors(torch_client, M, M, layer=5, microbatch=2) as ctx:
        out = (w * t).sum()
    assert ctx.stashed == 1
    # Drop the stash behind autograd's back: the reload finds nothing.
    (handle,) = [h for h in _live_handles(torch_client)]
    torch_client.release(handle.ticket)
    with pytest.raises(stashd.StashError, match="layer 5 microbatch 2") as info:
        with stash_torch.unwrap_errors():
            out.backward()
    assert info.value.code_name == "NOT_FOUND"
    assert isinstance(info.value.__cause__, RuntimeError)
    assert stash_torch.last_error() is info.value


def _live_handles(client):
    refs = client._extensions["torch"].prefetcher._groups.values()
    return [r() for group in refs for r in group if r() is not None and r().pending]


# --- 8. a daemon that dies: forward goes on -----------------------------------------------

def test_forward_goes_on_when_the_daemon_dies(start_daemon, mode):
    from conftest import TORCH_MODES

    d = start_daemon()
    c = d.connect(**TORCH_MODES[mode])
    x = torch.randn(M, H, dtype=torch.float64)
    w1 = torch.randn(M, H, dtype=torch.float64, requires_grad=True)
    w2 = torch.randn(M, H, dtype=torch.float64, requires_grad=True)
    with stash_torch.stash_saved_tensors(c, M, M, layer=0) as before:
        out1 = (w1 * stash_torch.mark(x * 1.0)).sum()
    assert before.stashed == 1
    assert d.stop() == 0  # the daemon goes away after the first layer's forward
    if mode == "daemon-copy":
        with pytest.warns(stash_torch.StashWarning, match="cannot be reached"):
            with stash_torch.stash_saved_tensors(c, M, M, layer=1) as after:
                out2 = (w2 * stash_torch.mark(x * 2.0)).sum()
        assert (after.stashed, after.unavailable) == (0, 1)
        assert c.step_flags().unavailable
    else:  # mapped: the rank pages into the chunks it holds; the daemon is not asked
        with stash_torch.stash_saved_tensors(c, M, M, layer=1) as after:
            out2 = (w2 * stash_torch.mark(x * 2.0)).sum()
        # SIGTERM drained first (kDaemonDraining in the control block): the rank keeps the
        # tensor itself, without a flag (nothing was lost).
        assert (after.stashed, after.overflowed, after.unavailable) == (0, 1, 0)
        assert not c.step_flags().overflow and not c.step_flags().unavailable
    out2.backward()  # kept in-process or reloaded from the chunks: exact
    assert torch.equal(w2.grad, x * 2.0)
    if mode == "daemon-copy":  # the rows lived in the daemon
        with pytest.raises(stashd.Unavailable, match="layer 0 microbatch 0.*daemon.*gone"):
            with stash_torch.unwrap_errors():
                out1.backward()
    else:  # mapped: the chunks are still mapped
        out1.backward()
        assert torch.equal(w1.grad, x)
    c.close()


# --- 9. name, layer and microbatch travel with every stash --------------------------------

class _SpyLib:
    """Delegates to the ctypes library and records the tags of every stash (stash_stash, and
    stash_stash_wait: a stash waited for at once)."""

    def __init__(self, lib):
        self._lib = lib
        self.tags = []

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def _record(self, args_ref):
        args = args_ref._obj  # ctypes.byref(StashArgs)
        self.tags.append((args.name.decode() if args.name else None, args.layer,
                          args.microbatch))

    def stash_stash(self, handle, args_ref, ticket_ref):
        self._record(args_ref)
        return self._lib.stash_stash(handle, args_ref, ticket_ref)

    def stash_stash_wait(self, handle, args_ref, *rest):
        self._record(args_ref)
        return self._lib.stash_stash_wait(handle, args_ref, *rest)


def test_name_layer_and_microbatch_are_sent_with_each_stash(torch_client):
    spy = torch_client._lib = _SpyLib(torch_client._lib)
    w = torch.randn(M, H, requires_grad=True)
    outs = []
    for m in range(2):
        with stash_torch.microbatch(m):
            with stash_torch.stash_saved_tensors(torch_client, M, M, name="experts", layer=7):
                outs.append((w * stash_torch.mark(torch.randn(M, H))).sum())
    sum(outs).backward()
    assert spy.tags == [("experts", 7, 0), ("experts", 7, 1)]
