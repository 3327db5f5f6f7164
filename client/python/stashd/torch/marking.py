"""Which saved tensors are stashed: markers (TE's and stashd's) and storage keys for register().

Row geometry lives here too: how many rows a marked tensor has (data: one per token; an MXFP8
columnwise scale_inv: one per 32 tokens, TE pads them to a multiple of 4) and how many of them
are valid for a token count.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import torch

from stashd.buffer import Buffer

TE_MARKER_ATTRIBUTE = "grouped_tensor_scale_inv"
STASHD_MARKER_ATTRIBUTE = "stashd_scale_inv"
# MXFP8 keeps one E8M0 scale per 32 values: a columnwise scale_inv has a row per 32 tokens.
SCALE_INV_BLOCK_TOKENS = 32
# Transformer Engine allocates MXFP8 columnwise scale_inv with its rows padded to a multiple of 4.
TE_SCALE_ROW_PADDING = 4


def mark(*tensors: Optional[torch.Tensor], scale_inv: bool = False):
    """Marks tensors for the stash with stashd's own attribute; None entries are skipped.

    scale_inv=False: token-major data (max_tokens rows); True: an MXFP8 columnwise scale_inv
    (ceil(max_tokens / 32) rows, or that padded to a multiple of 4 as TE allocates it). Returns
    the tensor (one argument) or the tuple. Like TE's marker the attribute is lost by
    view/reshape/detach: use register() for tensors that pass through those.
    """
    for t in tensors:
        if t is not None:
            setattr(t, STASHD_MARKER_ATTRIBUTE, bool(scale_inv))
    return tensors[0] if len(tensors) == 1 else tensors


def marker(t: torch.Tensor) -> Optional[bool]:
    """The marker a tensor carries: None = unmarked, False = data rows, True = scale_inv rows.
    TE's attribute is read first, stashd's own second (registration is per context)."""
    for name in (TE_MARKER_ATTRIBUTE, STASHD_MARKER_ATTRIBUTE):
        value = getattr(t, name, None)
        if value is not None:
            return bool(value)
    return None


def _storage(t: torch.Tensor):
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def storage_key(t: torch.Tensor) -> Tuple[int, int, int]:
    """(storage pointer, byte offset, bytes): identical for t and its contiguous aliases."""
    base = _storage(t).data_ptr()
    return (base, t.data_ptr() - base, t.numel() * t.element_size())


try:  # torch >= 2.0
    from torch.utils.weak import StorageWeakRef as _StorageWeakRef
except ImportError:  # torch 1.13 (Debian 12)
    from torch.multiprocessing.reductions import StorageWeakRef as _StorageWeakRef


def storage_ref(t: torch.Tensor):
    """A weak reference to t's storage (not to the tensor object): `.expired()` turns True when
    the last tensor over the storage is gone, so a registration outlives temporary views."""
    return _StorageWeakRef(_storage(t))


def scale_rows(tokens: int) -> int:
    """Rows of an MXFP8 columnwise scale_inv for `tokens` tokens: ceil(tokens / 32); the last
    block may be partial (tokens 32..39 of 40 have the second row)."""
    return -(-max(int(tokens), 0) // SCALE_INV_BLOCK_TOKENS)


def valid_rows(tokens: int, divisor: int) -> int:
    """The rows that hold the first `tokens` tokens: tokens for data, ceil(tokens / 32) for a
    scale_inv (the daemon's RowCount rule: ceil(count / divisor))."""
    tokens = max(int(tokens), 0)
    return -(-tokens // divisor)


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def as_tensor(buffer: Buffer, dtype: torch.dtype, shape: Sequence[int],
              offset: int = 0) -> torch.Tensor:
    """A tensor over buffer[offset:] (no copy). It keeps the Buffer object alive, but
    buffer.free() unmaps the memory at once: drop the tensor first."""
    shape = tuple(int(s) for s in shape)
    count = math.prod(shape)
    element = torch.empty((), dtype=dtype).element_size()
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    array = buffer._array(offset, count * element)
    return torch.frombuffer(array, dtype=dtype, count=count).view(shape)
