"""stashd: the Python client of the per-node activation stash daemon.

A pure-Python package over libstash_client.so's C ABI (ctypes), so one build of the library
serves every Python version. `import stashd` needs no torch; `import stashd.torch` adds the
autograd integration (saved_tensors_hooks).

    client = stashd.connect()                      # $STASHD_SOCKET or the default socket
    src = stashd.Buffer(1 << 20)                   # shared memory the daemon can map
    done = client.stash(src, row_bytes=4096, max_rows=256, count=200)
    if not done.overflowed:
        client.reload(done.ticket, src, zero_tail=True)

The library is found next to this package, through $STASHD_CLIENT_LIB, or in the build tree
(see stashd._lib); a failure lists every path tried.
"""

from stashd._lib import LibraryNotFound
from stashd.buffer import Buffer
from stashd.client import Client, Completion, SessionInfo, Stats, StepFlags, Tier, version
from stashd.connect import connect, default_device
from stashd.disabled import DisabledClient, DisabledWarning
from stashd.errors import CODE_NAMES, DeadlineExceeded, StashError, Unavailable

# The project version (CMakeLists.txt); pyproject.toml reads it from here.
__version__ = "0.1.0"

__all__ = [
    "Buffer",
    "CODE_NAMES",
    "Client",
    "Completion",
    "DeadlineExceeded",
    "DisabledClient",
    "DisabledWarning",
    "LibraryNotFound",
    "SessionInfo",
    "Stats",
    "StashError",
    "StepFlags",
    "Tier",
    "Unavailable",
    "connect",
    "default_device",
    "version",
]
