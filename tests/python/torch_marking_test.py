"""stashd.torch marking rules: which saved tensors the pack hook takes, and how they come back."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")  # stashd.torch is optional: skip without torch

import stashd
import stashd.torch as stash_torch
from saving import Save, save_and_reload

M = 64  # max tokens
H = 8


def grads_of(fn, *inputs):
    inputs = [i.detach().clone().requires_grad_() for i in inputs]
    fn(*inputs).sum().backward()
    return [i.grad for i in inputs]


@pytest.mark.parametrize("registered", [False, True])
def test_marker_lost_through_view_is_caught_by_storage_registration(client, registered):
    x = torch.randn(M, H, dtype=torch.float64)
    w = torch.randn(H, dtype=torch.float64)

    def layer(x, w):
        h = x * 2
        h.grouped_tensor_scale_inv = False
        if registered:
            stash_torch.register(h)
        v = h.view(M, 2, H // 2)  # a TE-internal reshape: a new object, no attribute
        assert not hasattr(v, "grouped_tensor_scale_inv")
        return v * w.view(2, H // 2)  # mul saves v

    expected = grads_of(layer, x, w)
    with stash_torch.stash_saved_tensors(client, M, M) as ctx:
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        out = layer(xs, ws)
    out.sum().backward()
    assert ctx.stashed == (1 if registered else 0)
    assert client.stats().stashes == ctx.stashed
    assert torch.equal(xs.grad, expected[0]) and torch.equal(ws.grad, expected[1])


def test_detached_alias_of_a_registered_tensor_is_stashed(client):
    w = torch.randn(M, H, requires_grad=True)
    h = torch.randn(M, H)
    with stash_torch.stash_saved_tensors(client, M, 40) as ctx:
        stash_torch.register(h)
        out = w * h.detach()  # mul saves the detached alias
    out.sum().backward()
    assert ctx.stashed == 1
    assert torch.equal(w.grad[:40], h[:40])  # the valid prefix came back exactly


def test_unmarked_tensors_are_never_stashed(client):
    x = torch.randn(M, H, requires_grad=True)
    w = torch.randn(H, H, requires_grad=True)
    with stash_torch.stash_saved_tensors(client, M, M) as ctx:
        out = torch.nn.functional.silu(x @ w) * x
    out.sum().backward()
    assert ctx.stashed == 0 and ctx.passed > 0
    assert client.stats().stashes == 0


def test_zero_dim_and_empty_marked_tensors_pass_through(client):
    x = torch.randn(M, H, requires_grad=True)
    s = stash_torch.mark(torch.tensor(3.0, requires_grad=True))
    s.grouped_tensor_scale_inv = False
    empty = stash_torch.mark(torch.empty(0, H))
    got, ctx0 = save_and_reload(client, empty)
    assert ctx0.stashed == 0 and ctx0.passed == 1 and got.shape == empty.shape
    with stash_torch.stash_saved_tensors(client, M, M) as ctx:
        out = x * s  # saves the 0-dim s
    out.sum().backward()
    assert ctx.stashed == 0
    assert torch.equal(s.grad, x.detach().sum())
    assert client.stats().stashes == 0


def test_sparse_tensors_pass_through_a_registry(client):
    w = torch.randn(M, H, requires_grad=True)
    sparse = torch.eye(M, H).to_sparse()
    with stash_torch.stash_saved_tensors(client, M, M) as ctx:
        stash_torch.register(torch.randn(M, H))  # a non-empty registry looks at every save
        out = torch.sparse.mm(sparse, w.t()).sum()  # saves the sparse operand
    out.backward()
    assert ctx.stashed == 0 and ctx.passed > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16,
                                   torch.uint8, torch.int64])
@pytest.mark.parametrize("zero_tail", [False, True])
def test_marked_tensor_comes_back_with_shape_dtype_and_valid_rows(client, dtype, zero_tail):
    t = (torch.arange(M * H * 3) % 251).to(dtype).reshape(M, H, 3)
    stash_torch.mark(t)
    got, ctx = save_and_reload(client, t, num_tokens=torch.tensor(48), zero_tail=zero_tail)
    assert ctx.stashed == 1
    assert got is not t
    assert got.shape == t.shape and got.dtype == t.dtype and got.device == t.device
    assert torch.equal(got[:48], t[:48])
    if zero_tail:
        assert not got[48:].any()
    stats = client.stats()
    assert stats.bytes_stashed == 48 * H * 3 * t.element_size() == stats.bytes_reloaded
    assert stats.pages_used == 0


def test_scale_inv_marker_means_a_row_per_32_tokens(client):
    # An MXFP8 columnwise scale_inv of 128 tokens: 4 rows; 64 valid tokens -> 2 rows.
    t = torch.arange(4 * 16, dtype=torch.uint8).reshape(4, 16)
    t.grouped_tensor_scale_inv = True
    got, ctx = save_and_reload(client, t, max_tokens=128, num_tokens=torch.tensor(64),
                               zero_tail=True)
    assert ctx.stashed == 1
    assert torch.equal(got[:2], t[:2]) and not got[2:].any()
    assert client.stats().bytes_stashed == 2 * 16


def test_mark_with_scale_inv_uses_stashd_own_attribute(client):
    t = stash_torch.mark(torch.ones(2, 5), scale_inv=True)
    assert stash_torch.marker(t) is True and not hasattr(t, "grouped_tensor_scale_inv")
    got, ctx = save_and_reload(client, t, max_tokens=64, num_tokens=32)
    assert ctx.stashed == 1 and torch.equal(got[:1], t[:1])


def test_row_width_that_does_not_divide_is_a_clear_error(client):
    # The pack hook raises ValueError; autograd may re-raise it as a RuntimeError with the text.
    t = stash_torch.mark(torch.ones(M + 1, 3, dtype=torch.float64))
    with pytest.raises((ValueError, RuntimeError), match=r"does not split into 64 rows"):
        save_and_reload(client, t)
    half = stash_torch.mark(torch.ones(M // 2, dtype=torch.float32))  # 2 bytes per row
    with pytest.raises((ValueError, RuntimeError), match=r"rows of whole elements"):
        save_and_reload(client, half)
    # A scale_inv of max_tokens=48 has ceil(48 / 32) = 2 rows, or 4 as TE pads them; not 3.
    s = stash_torch.mark(torch.ones(3, 4), scale_inv=True)
    with pytest.raises((ValueError, RuntimeError), match=r"has 3 rows.*ceil\(max_tokens / 32\)"):
        save_and_reload(client, s, max_tokens=48, num_tokens=48)
    assert client.stats().stashes == 0


def test_count_beyond_the_budget_overflows_and_keeps_the_tensor(client):
    t = stash_torch.mark(torch.randn(M, H))
    got, ctx = save_and_reload(client, t, num_tokens=M + 32)
    assert got.data_ptr() == t.data_ptr()  # nothing was taken: autograd kept the tensor itself
    assert (ctx.stashed, ctx.overflowed) == (0, 1)
    assert client.step_flags().overflow


def test_noncontiguous_marked_tensor_is_stashed_by_its_values(client):
    base = torch.randn(H, M)
    t = stash_torch.mark(base.t())  # [M, H], token-major values, transposed strides
    got, ctx = save_and_reload(client, t)
    assert ctx.stashed == 1 and torch.equal(got, t)


def test_registration_ends_with_its_context(client):
    h = torch.randn(M, H)
    with stash_torch.stash_saved_tensors(client, M, M):
        stash_torch.register(h)
    got, ctx = save_and_reload(client, h.view(M * H))
    assert ctx.stashed == 0
    assert stash_torch.register(h) is h  # outside a context: nothing to register with


def test_hooks_are_gone_after_the_context(client):
    t = stash_torch.mark(torch.randn(M, H))
    with stash_torch.stash_saved_tensors(client, M, M):
        pass
    w = torch.randn(M, H, requires_grad=True)
    (w * t).sum().backward()
    assert client.stats().stashes == 0


def test_retain_graph_reloads_once_and_reuses_the_tensor(client):
    t = stash_torch.mark(torch.randn(M, H))
    w = torch.randn(M, H, requires_grad=True)
    with stash_torch.stash_saved_tensors(client, M, M) as ctx:
        out = (w * t).sum()
    out.backward(retain_graph=True)
    first = w.grad.clone()
    out.backward()
    assert ctx.stashed == 1 and client.stats().reloads == 1
    assert torch.equal(w.grad, 2 * first) and torch.equal(first, t)


def test_buffer_tensor_views_shared_memory():
    with stashd.Buffer(64) as b:
        t = stash_torch.as_tensor(b, torch.int32, (2, 4), offset=16)
        t.fill_(7)
        assert b.read(16, 4) == (7).to_bytes(4, "little")
        assert b.read(0, 16) == bytes(16)
        del t


def test_bad_arguments_are_rejected(client):
    with pytest.raises(ValueError, match="max_tokens"):
        stash_torch.stash_saved_tensors(client, 0, 0)
    with pytest.raises(ValueError, match="num_tokens"):
        stash_torch.stash_saved_tensors(client, 64, torch.tensor([1.5]))
    with pytest.raises(TypeError):
        stash_torch.stash_saved_tensors(object(), 64, 1)


def test_cuda_path_event_counters_are_per_stream_and_only_grow(client):
    # The cuda path orders stashes and reloads with one counter per (stream, ready|done); a
    # counter's values must grow by one per use, and streams must never share a counter (two
    # streams raising one counter out of order would release a copy too early).
    state = stash_torch._TorchState.of(client)
    a1 = state.event(0x10, "ready")
    a2 = state.event(0x10, "ready")
    b1 = state.event(0x20, "ready")
    d1 = state.event(0x10, "done")
    assert a1[0] is a2[0] is b1[0]  # one Buffer holds them all
    assert a1[1] == a2[1] and (a1[2], a2[2]) == (1, 2)
    assert len({a1[1], b1[1], d1[1]}) == 3
    assert b1[2] == 1 and d1[2] == 1
    assert all(off % 8 == 0 for _, off, _ in (a1, b1, d1))


def test_empty_cache_waits_for_dropped_stashes_on_the_host_backend(client):
    # stash_torch.empty_cache = flush + release_device_mappings + torch.cuda.empty_cache: on the
    # host backend it must still flush the releases of stashes autograd dropped unread.
    t = stash_torch.mark(torch.arange(M * H, dtype=torch.float32).reshape(M, H))
    anchor = torch.ones(1, requires_grad=True)
    with stash_torch.stash_saved_tensors(client, M, M):
        out = Save.apply(t, anchor, [])
    assert client.stats().stashes_live == 1
    del out  # the graph goes without backward: the handle releases its stash
    stash_torch.empty_cache(client)
    assert client.stats().stashes_live == 0


@pytest.mark.parametrize("mode", ["daemon-copy", "mapped"])
def test_the_gpu_checks_torch_script_passes_on_cpu(daemon, mode):
    # tests/gpu/torch_cuda_check.py is check.sh's PyTorch step on a GPU node; its --cpu mode runs
    # the same parity check here, so the script itself is known to work before a GPU runs it.
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(__file__), os.pardir, "gpu", "torch_cuda_check.py")
    env = dict(os.environ, STASHD_SOCKET=daemon.socket)
    run = subprocess.run([sys.executable, script, "--cpu", "--mode", mode, "--max-tokens", "256",
                          "--hidden", "64"], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"({mode}): parity OK over 3 steps, 12 stashes" in run.stdout, run.stdout
