"""stashd.torch.connect(): stashd.connect() in the group of the job's sessions on this node.

The sessions of one job on one node form a group (docs/security.md, "Groups"): the same Unix
user, the same group name and a 32-byte secret that only the job's ranks know. stashd.connect()
takes them as arguments or from $STASHD_GROUP / $STASHD_GROUP_SECRET; stashd.torch.connect()
also forms the group by itself for a job started by torchrun or Slurm:

  * the name from the launcher: "torchrun:<TORCHELASTIC_RUN_ID>@<MASTER_ADDR>:<MASTER_PORT>"
    (torchrun's run id is "none" unless --rdzv-id names one, so the rendezvous address tells two
    concurrent jobs apart), else "slurm:<SLURM_JOB_ID>.<SLURM_STEP_ID>" (".<step>" only when
    $SLURM_STEP_ID is set); characters the daemon does not take become "_";
  * the secret: global rank 0 draws os.urandom(32) and torch.distributed.broadcast_object_list
    hands it to every rank over the default process group.

The broadcast is a collective: call stashd.torch.connect() at the same point on every rank,
after torch.distributed.init_process_group (with NCCL, after torch.cuda.set_device). Every rank
decides alike whether to take part, from what the whole job shares: the arguments, $STASHD_GROUP
and the launcher's variables. Without torch.distributed initialised no group is formed (a secret
could not be shared; logged at debug level) and the session is in no group, as with
stashd.connect().
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any, Optional, Tuple

from stashd.client import Client
from stashd.connect import GROUP_SECRET_BYTES
from stashd.connect import connect as _connect

_log = logging.getLogger("stashd.torch")

_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9._:@+-]")


def _name(text: str) -> str:
    return _NOT_IN_NAME.sub("_", text)[:128]


def launcher_group_name() -> Optional[str]:
    """The group name of this job from its launcher's environment (module docstring), or None
    when neither torchrun nor Slurm started it."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id:
        where = ""
        addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if addr and port:
            where = f"@{addr}:{port}"
        return _name(f"torchrun:{run_id}{where}")
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        step = os.environ.get("SLURM_STEP_ID")
        return _name(f"slurm:{job}.{step}" if step else f"slurm:{job}")
    return None


def shared_secret() -> Optional[bytes]:
    """32 random bytes drawn on global rank 0 and broadcast over the default process group, the
    same on every rank; None (no collective) when torch.distributed is not initialised. A
    collective: every rank of the default group must call it at the same point."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not dist.is_available() or not dist.is_initialized():
        return None
    box = [os.urandom(GROUP_SECRET_BYTES) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    secret = box[0]
    if not isinstance(secret, bytes) or len(secret) != GROUP_SECRET_BYTES:
        raise RuntimeError(f"stashd.torch: rank 0 broadcast a group secret of {secret!r:.40}, not "
                           f"{GROUP_SECRET_BYTES} bytes")
    return secret


def job_group() -> Optional[Tuple[str, bytes]]:
    """(name, secret) of the group stashd.torch.connect() forms when told none (module
    docstring), or None when it forms none. A collective when torch.distributed is initialised
    and the launcher names the job: call it at the same point on every rank."""
    name = launcher_group_name()
    if name is None:
        _log.debug("stashd.torch: no group: neither torchrun ($TORCHELASTIC_RUN_ID) nor Slurm "
                   "($SLURM_JOB_ID) started this process")
        return None
    secret = shared_secret()
    if secret is None:
        _log.debug("stashd.torch: no group %s: torch.distributed is not initialised, so the ranks "
                   "cannot share a secret (call init_process_group before connecting)", name)
        return None
    return name, secret


def connect(*args: Any, group: Optional[str] = None, group_secret: Optional[bytes] = None,
            **kwargs: Any) -> Client:
    """stashd.connect(*args, **kwargs) with the job's group (module docstring): the group given
    here or by $STASHD_GROUP, else the one job_group() forms (a collective over the default
    process group when torch.distributed is initialised: call this on every rank at the same
    point), else none."""
    if group is None and group_secret is None and not os.environ.get("STASHD_GROUP"):
        formed = job_group()
        if formed is not None:
            group, group_secret = formed
    return _connect(*args, group=group, group_secret=group_secret, **kwargs)
