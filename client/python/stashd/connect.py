"""stashd.connect(): opens a session with the daemon, or hands out a DisabledClient when the job
runs without a stash. Apart from client.py so that imports run one way: client <- disabled <-
connect."""

from __future__ import annotations

import ctypes
import os
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


def connect(socket: Optional[str] = None, device: Optional[int] = None, rank: int = -1,
            label: str = "",
            allow_host_spill: bool = True, connect_timeout_ms: int = 5000,
            backend: str = "host", mode: str = "daemon-copy",
            lease: Union[str, Dict[str, int]] = "auto", copy_threads: int = 0) -> Client:
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
