"""Activation checkpointing: where a stash context finds itself, so it neither stashes during a
recompute (a wasted round trip) nor breaks a non-reentrant checkpoint it runs inside of.

Saved-tensor hooks form a stack and only the innermost pair runs. So:
  * a context inside a reentrant checkpoint (torch.utils.checkpoint(use_reentrant=True),
    Megatron's and TE's checkpoint) sees nothing in forward (it runs under no_grad) and runs
    again during backward to recompute: that recompute is detected and nothing is stashed;
  * a context inside a non-reentrant checkpoint (use_reentrant=False) would replace the
    checkpoint's hooks and keep every tensor of the region: it is detected and installs no
    hooks, so the checkpoint keeps working (it recomputes those activations instead);
  * a context around a checkpoint sees nothing: the checkpoint's hooks are innermost.
The README's table lists each combination.
"""

from __future__ import annotations

import enum
import os
import sys
from typing import Optional

import torch

# Files whose frames on the stack mean a checkpoint is running (by path suffix).
_TORCH_CHECKPOINT = os.path.join("torch", "utils", "checkpoint.py")
_TORCH_FUNCTION = os.path.join("torch", "autograd", "function.py")
# Non-reentrant checkpoint: the function that runs the region in forward, and the unpack hook
# (or its helper) that recomputes it in backward, in torch 1.13 and 2.x.
_NON_REENTRANT_FORWARD = {"_checkpoint_without_reentrant", "_checkpoint_without_reentrant_generator"}
_NON_REENTRANT_RECOMPUTE = {"unpack", "unpack_hook", "recompute_fn"}


class Phase(enum.Enum):
    NORMAL = "normal"                       # stash as usual
    NO_GRAD = "no_grad"                     # nothing is saved (a reentrant checkpoint's forward)
    RECOMPUTE = "recompute"                 # backward is recomputing a checkpointed region
    IN_CHECKPOINT = "in_checkpoint"         # forward inside a non-reentrant checkpoint


def _backward_running() -> Optional[bool]:
    """True/False where PyTorch can say whether this thread runs an autograd graph task."""
    task_id = getattr(torch._C, "_current_graph_task_id", None)
    if task_id is None:
        return None
    return task_id() != -1


def phase() -> Phase:
    """Where a stash context entered now would run."""
    if not torch.is_grad_enabled():
        return Phase.NO_GRAD
    running = _backward_running()
    in_forward_checkpoint = False
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        filename = code.co_filename
        if filename.endswith(_TORCH_CHECKPOINT):
            if code.co_name in _NON_REENTRANT_RECOMPUTE:
                return Phase.RECOMPUTE
            if code.co_name in _NON_REENTRANT_FORWARD or (
                    code.co_name == "checkpoint" and frame.f_locals.get("use_reentrant") is False):
                in_forward_checkpoint = True
        elif running is None and filename.endswith(_TORCH_FUNCTION) and code.co_name == "apply":
            # BackwardCFunction.apply: a custom Function's backward runs this forward, which is
            # what every reentrant checkpoint (torch's, Megatron's, TE's) does to recompute.
            return Phase.RECOMPUTE
        frame = frame.f_back
    if running:
        return Phase.RECOMPUTE
    return Phase.IN_CHECKPOINT if in_forward_checkpoint else Phase.NORMAL
