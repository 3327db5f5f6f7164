"""stashd.connect(): opens a session with the daemon, or hands out a DisabledClient when the job
runs without a stash. Apart from client.py so that imports run one way: client <- disabled <-
connect."""

from __future__ import annotations

import ctypes
import os
import re
import sys
from typing import Dict, Optional, Union

from stashd import _lib
from stashd.client import BACKENDS, LEASE_TIERS, MODES, Client
from stashd.disabled import DisabledClient, disabled_reason
from stashd.errors import error_for


def default_device() -> int:
    """The device a rank's session uses when connect() is not told: the current CUDA device
    when PyTorch has initialised CUDA (torch.cuda.set_device(local_rank) is the usual setup),
    else $LOCAL_RANK (set by torchrun and Megatron's launchers), else 0."""
    torch = sys.modules.get("torch")  # never imported here: `import stashd` needs no torch
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return int(torch.cuda.current_device())
        except Exception:  # a CPU-only build or a broken driver: fall back to the launcher's
            pass
    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank:
        try:
            device = int(local_rank)
        except ValueError:
            raise ValueError(f"stashd.connect: $LOCAL_RANK must be an integer, got "
                             f"{local_rank!r}; pass device= explicitly") from None
        if device >= 0:
            return device
    return 0


# Hello.group: what the daemon takes (daemon/sessions/group_registry.h, CheckGroupFields).
GROUP_NAME = re.compile(r"[A-Za-z0-9._:@+-]{1,128}")
GROUP_SECRET_BYTES = 32


def check_group(group: Optional[str], group_secret: Optional[bytes]) -> None:
    """Raises ValueError unless connect()'s group arguments are usable: both None (or empty), or a
    group name of 1-128 characters of A-Z a-z 0-9 . _ : @ + - and a secret of exactly 32 bytes."""
    if group is not None and not isinstance(group, str):
        raise ValueError(f"stashd.connect: group must be a str (the job's group name), not "
                         f"{type(group).__name__}")
    if group_secret is not None and not isinstance(group_secret, (bytes, bytearray)):
        raise ValueError(f"stashd.connect: group_secret must be bytes ({GROUP_SECRET_BYTES} of "
                         f"them, e.g. os.urandom({GROUP_SECRET_BYTES}) drawn once per job), not "
                         f"{type(group_secret).__name__}")
    if not group and not group_secret:
        return
    if not group:
        raise ValueError("stashd.connect: group_secret is given but group is not: name the group "
                         "too, or give neither for a session in no group")
    if not GROUP_NAME.fullmatch(group):
        raise ValueError(f"stashd.connect: group {group!r} is not 1-128 characters of "
                         f"A-Z a-z 0-9 . _ : @ + -")
    if group_secret is None or len(group_secret) != GROUP_SECRET_BYTES:
        have = "none" if group_secret is None else f"{len(group_secret)} bytes"
        raise ValueError(f"stashd.connect: group {group!r} needs a group_secret of exactly "
                         f"{GROUP_SECRET_BYTES} bytes, the same for every rank of the job; "
                         f"got {have}")


def connect(socket: Optional[str] = None, device: Optional[int] = None, rank: int = -1,
            label: str = "",
            allow_host_spill: bool = True, connect_timeout_ms: int = 5000,
            backend: str = "host", mode: str = "daemon-copy",
            lease: Union[str, Dict[str, int]] = "auto", copy_threads: int = 0,
            group: Optional[str] = None, group_secret: Optional[bytes] = None) -> Client:
    """Opens a session with the daemon.

    backend: "host" (shared memory; CI, laptops) or "cuda" (GPU tensors through CUDA IPC; needs
    the NVIDIA driver and a daemon started with --backend=cuda); must match the daemon's.

    socket: the daemon's Unix socket; None = $STASHD_SOCKET, else the default
    (/run/stashd/stashd.sock, or the per-user fallback). device: this rank's GPU (the simulated
    pool on the host backend); None = default_device(): the current CUDA device, else
    $LOCAL_RANK, else 0, so every rank of a node gets its own pool. rank: -1 = unknown. label: shown by `stashctl sessions`.
    allow_host_spill: False makes a full pool overflow instead of spilling to the host tier.
    Raises Unavailable, naming the socket, when no daemon answers within connect_timeout_ms.

    mode: "daemon-copy" (the daemon copies registered buffers) or "mapped" (the daemon leases
    pool chunks to this process, which pages its activations itself; on the cuda backend with
    the library's kernels on the tensors' current stream).
    lease (mapped mode): "auto" (the daemon sizes it at every begin_step) or a dict of bytes per
    tier, e.g. {"device": 64 << 20, "host": 16 << 20} (keys "device", "peer", "host").
    copy_threads (mapped mode): threads splitting one copy; 0 = the library's default.

    group, group_secret: the group of sessions this one joins, the sessions of one job on this
    node (docs/security.md, "Groups"): group is 1-128 characters of A-Z a-z 0-9 . _ : @ + -, and
    group_secret exactly 32 bytes, the same for every rank of the job (e.g. os.urandom(32) drawn
    on rank 0 and broadcast; stashd.torch.connect() does that for torchrun and Slurm jobs). Both
    or neither (ValueError otherwise); None = the library's rule: $STASHD_GROUP and
    $STASHD_GROUP_SECRET (64 hex characters) when set, else no group. The first session naming
    a group creates it for this Unix user and secret; a later one of another user, or with another
    secret, raises StashError with code_name "PERMISSION_DENIED".

    With $STASHD_DISABLED set (not 0/false/no/off; the Slurm task prolog sets it when no stashd
    could be started for the job) it returns a stashd.DisabledClient that stashes nothing (every
    stash answers OVERFLOW, the caller keeps its data) and warns once, instead of raising.
    """
    if backend not in BACKENDS:
        raise ValueError(f"stashd.connect: backend must be 'host' or 'cuda', not {backend!r}")
    if mode not in MODES:
        raise ValueError(f"stashd.connect: mode must be 'daemon-copy' or 'mapped', not {mode!r}")
    if isinstance(lease, str):
        if lease != "auto":
            raise ValueError(f"stashd.connect: lease must be 'auto' or a dict of bytes per tier, "
                             f"not {lease!r}")
    else:
        unknown = sorted(set(lease) - set(LEASE_TIERS))
        if unknown:
            raise ValueError(f"stashd.connect: lease tiers are {', '.join(LEASE_TIERS)}; not "
                             f"{', '.join(unknown)}")
        for tier, value in lease.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"stashd.connect: lease[{tier!r}] is {value!r}: give a whole "
                                 f"number of bytes >= 0 (0 = none of that tier)")
    check_group(group, group_secret)
    reason = disabled_reason()
    if reason is not None:
        return DisabledClient(reason, socket, backend, mode)
    if device is None:
        device = default_device()
    lib = _lib.lib()
    handle = _lib.c_client_p()
    options = _lib.OpenOptions()
    lib.stash_open_options_init(ctypes.byref(options))
    options.socket = socket.encode() if socket else None
    options.backend = BACKENDS[backend]
    options.device = int(device)
    options.rank = int(rank)
    options.label = label.encode() if label else None
    options.allow_host_spill = 1 if allow_host_spill else 0
    options.connect_timeout_ms = int(connect_timeout_ms)
    options.mode = MODES[mode]
    if isinstance(lease, dict):
        options.lease_automatic = 0
        options.lease_device_bytes = int(lease.get("device", 0))
        options.lease_peer_bytes = int(lease.get("peer", 0))
        options.lease_host_bytes = int(lease.get("host", 0))
    if copy_threads:
        options.copy_threads = int(copy_threads)
    if group:
        secret = bytes(group_secret or b"")
        code = lib.stash_client_open_group(ctypes.byref(options), group.encode(), secret,
                                           len(secret), ctypes.byref(handle))
    else:
        code = lib.stash_client_open_ex(ctypes.byref(options), ctypes.byref(handle))
    shown = socket or os.environ.get("STASHD_SOCKET") or "the default socket"
    if code != 0:
        message = _lib.last_error()
        if shown not in message:
            message = f"{message} (socket: {shown})"
        raise error_for(code, message)
    client = Client(handle.value, shown, backend)
    client.mode = mode
    client.device = int(device)
    return client
