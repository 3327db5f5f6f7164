"""Finds and loads libstash_client.so and declares the C ABI (include/stash/c_api.h).

ctypes rather than a compiled extension: one build of the C++ library serves every Python
version, and the library stays a guest that exports only `stash_*` symbols.

Where the library is looked for, first hit wins:
  1. $STASHD_CLIENT_LIB: the file itself (an error when set but unloadable: no silent fallback).
  2. Next to this package (a wheel or an install may drop the library there).
  3. $STASHD_BIN_DIR/client/ (the build tree ctest names).
  4. The repository's build trees: build/release/client/, then build/*/client/, newest first.
  5. The dynamic loader's own search (LD_LIBRARY_PATH, ldconfig).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import threading
from typing import List, Optional, Tuple

LIBRARY_NAME = "libstash_client.so"

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# client/python/stashd -> the repository root.
_REPO_ROOT = os.path.normpath(os.path.join(_PACKAGE_DIR, os.pardir, os.pardir, os.pardir))


class LibraryNotFound(ImportError):
    """libstash_client.so could not be loaded; the message lists every path tried and why."""


# --- C types --------------------------------------------------------------------------------

c_buffer_p = ctypes.c_void_p  # stash_buffer_t*
c_client_p = ctypes.c_void_p  # stash_client_t*


class StashArgs(ctypes.Structure):
    """stash_stash_args_t."""

    _fields_ = [
        ("source", c_buffer_p),
        ("offset", ctypes.c_uint64),
        ("row_bytes", ctypes.c_uint64),
        ("max_rows", ctypes.c_uint64),
        ("count_value", ctypes.c_uint64),
        ("count_buffer", c_buffer_p),
        ("count_offset", ctypes.c_uint64),
        ("divisor", ctypes.c_uint32),
        ("layer", ctypes.c_uint32),
        ("microbatch", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("ready_buffer", c_buffer_p),
        ("ready_offset", ctypes.c_uint64),
        ("ready_value", ctypes.c_uint64),
        ("name", ctypes.c_char_p),
        ("device_source", ctypes.c_void_p),
        ("device_count", ctypes.c_void_p),
    ]


class CompletionStruct(ctypes.Structure):
    """stash_completion_t."""

    _fields_ = [
        ("ticket", ctypes.c_uint64),
        ("tier", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("rows", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("pages", ctypes.c_uint64),
        ("latency_us", ctypes.c_uint64),
        ("step_overflow", ctypes.c_int32),
        ("step_spilled", ctypes.c_int32),
    ]


class OpenOptions(ctypes.Structure):
    """stash_open_options_t."""

    _fields_ = [
        ("socket", ctypes.c_char_p),
        ("backend", ctypes.c_int),
        ("device", ctypes.c_int),
        ("rank", ctypes.c_int64),
        ("label", ctypes.c_char_p),
        ("allow_host_spill", ctypes.c_int),
        ("connect_timeout_ms", ctypes.c_int64),
        ("mode", ctypes.c_int),
        ("lease_automatic", ctypes.c_int),
        ("lease_device_bytes", ctypes.c_uint64),
        ("lease_peer_bytes", ctypes.c_uint64),
        ("lease_host_bytes", ctypes.c_uint64),
        ("copy_threads", ctypes.c_uint32),
    ]


STATS_FIELDS = (
    "page_bytes",
    "pool_pages_total", "pool_pages_used", "pool_pages_high_water",
    "host_pages_total", "host_pages_used", "host_pages_high_water",
    "stashes", "reloads", "releases",
    "bytes_stashed", "bytes_reloaded",
    "spills", "overflows", "rejected",
    "stashes_live", "pages_live",
)


class StatsStruct(ctypes.Structure):
    """stash_stats_t: every field a uint64, in STATS_FIELDS order."""

    _fields_ = [(name, ctypes.c_uint64) for name in STATS_FIELDS]


class SessionInfoStruct(ctypes.Structure):
    """stash_session_info_t."""

    _fields_ = [("session_id", ctypes.c_char * 64), ("page_bytes", ctypes.c_uint64),
                ("pool_pages", ctypes.c_uint64), ("host_tier_pages", ctypes.c_uint64)]


# --- Prototypes -----------------------------------------------------------------------------

_U64 = ctypes.c_uint64
_I64 = ctypes.c_int64
_INT = ctypes.c_int
_P_U64 = ctypes.POINTER(ctypes.c_uint64)

# name: (restype, argtypes)
_PROTOTYPES = {
    "stash_last_error": (ctypes.c_char_p, []),
    "stash_version": (ctypes.c_char_p, []),
    "stash_client_open": (_INT, [ctypes.c_char_p, _INT, _INT, _I64, ctypes.c_char_p, _INT, _I64,
                                 ctypes.POINTER(c_client_p)]),
    "stash_open_options_init": (None, [ctypes.POINTER(OpenOptions)]),
    "stash_client_open_ex": (_INT, [ctypes.POINTER(OpenOptions), ctypes.POINTER(c_client_p)]),
    "stash_client_open_group": (_INT, [ctypes.POINTER(OpenOptions), ctypes.c_char_p,
                                       ctypes.c_char_p, _U64, ctypes.POINTER(c_client_p)]),
    "stash_client_close": (None, [c_client_p]),
    "stash_buffer_alloc": (_INT, [_U64, ctypes.POINTER(c_buffer_p)]),
    "stash_buffer_free": (None, [c_buffer_p]),
    "stash_buffer_data": (ctypes.c_void_p, [c_buffer_p]),
    "stash_buffer_size": (_U64, [c_buffer_p]),
    "stash_event_signal": (None, [c_buffer_p, _U64, _U64]),
    "stash_event_wait": (_INT, [c_buffer_p, _U64, _U64, _I64]),
    "stash_stash": (_INT, [c_client_p, ctypes.POINTER(StashArgs), _P_U64]),
    "stash_reload": (_INT, [c_client_p, _U64, c_buffer_p, _U64, _INT, _P_U64]),
    "stash_stash_wait": (_INT, [c_client_p, ctypes.POINTER(StashArgs), _I64, _P_U64,
                                ctypes.POINTER(CompletionStruct)]),
    "stash_reload_wait": (_INT, [c_client_p, _U64, c_buffer_p, _U64, _INT, _I64, _P_U64,
                                 ctypes.POINTER(CompletionStruct)]),
    "stash_reload_device": (_INT, [c_client_p, _U64, ctypes.c_void_p, _INT, c_buffer_p, _U64, _U64,
                                   c_buffer_p, _U64, _U64, _P_U64]),
    "stash_enqueue_signal": (_INT, [c_client_p, c_buffer_p, _U64, _U64, ctypes.c_void_p]),
    "stash_enqueue_wait": (_INT, [c_client_p, c_buffer_p, _U64, _U64, ctypes.c_void_p]),
    "stash_unregister_device": (_INT, [c_client_p, ctypes.c_void_p, _P_U64]),
    "stash_release_device_mappings": (_INT, [c_client_p, _I64]),
    "stash_graphs_destroyed": (_INT, [c_client_p]),
    "stash_release": (_INT, [c_client_p, _U64, _P_U64]),
    "stash_begin_step": (_INT, [c_client_p, _U64, _P_U64]),
    "stash_stash_on_stream": (_INT, [c_client_p, ctypes.POINTER(StashArgs), _INT, ctypes.c_void_p,
                                     _P_U64]),
    "stash_reload_on_stream": (_INT, [c_client_p, _U64, ctypes.c_void_p, _INT, ctypes.c_void_p,
                                      _P_U64]),
    "stash_release_on_stream": (_INT, [c_client_p, _U64, ctypes.c_void_p, _P_U64]),
    "stash_begin_step_on_stream": (_INT, [c_client_p, _U64, ctypes.c_void_p, _P_U64]),
    "stash_wait": (_INT, [c_client_p, _U64, _I64, ctypes.POINTER(CompletionStruct)]),
    "stash_poll": (_INT, [c_client_p, _U64, ctypes.POINTER(CompletionStruct)]),
    "stash_step_flags": (_INT, [c_client_p, ctypes.POINTER(_INT), ctypes.POINTER(_INT)]),
    "stash_get_stats": (_INT, [c_client_p, ctypes.POINTER(StatsStruct)]),
    "stash_step_lost": (_INT, [c_client_p, ctypes.POINTER(_INT)]),
    "stash_get_session": (_INT, [c_client_p, ctypes.POINTER(SessionInfoStruct)]),
}


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)  # AttributeError: a library too old for this package
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def candidate_paths() -> List[Tuple[str, str]]:
    """(where it came from, path) pairs in search order; paths need not exist."""
    out: List[Tuple[str, str]] = []
    env = os.environ.get("STASHD_CLIENT_LIB")
    if env:
        out.append(("$STASHD_CLIENT_LIB", env))
    out.append(("next to the package", os.path.join(_PACKAGE_DIR, LIBRARY_NAME)))
    bin_dir = os.environ.get("STASHD_BIN_DIR")
    if bin_dir:
        out.append(("$STASHD_BIN_DIR", os.path.join(bin_dir, "client", LIBRARY_NAME)))
    release = os.path.join(_REPO_ROOT, "build", "release", "client", LIBRARY_NAME)
    out.append(("the release build tree", release))
    others = [p for p in glob.glob(os.path.join(_REPO_ROOT, "build", "*", "client", LIBRARY_NAME))
              if os.path.normpath(p) != os.path.normpath(release)]
    others.sort(key=lambda p: os.path.getmtime(p) if os.path.exists(p) else 0.0, reverse=True)
    out.extend(("a build tree", p) for p in others)
    if not others:
        out.append(("a build tree", os.path.join(_REPO_ROOT, "build", "*", "client",
                                                  LIBRARY_NAME)))
    return out


def _load() -> ctypes.CDLL:
    tried: List[str] = []
    for origin, path in candidate_paths():
        if origin == "$STASHD_CLIENT_LIB":
            # An explicit choice is final: falling back to another build would hide the mistake.
            try:
                return _declare(ctypes.CDLL(path))
            except (OSError, AttributeError) as e:
                raise LibraryNotFound(
                    f"stashd: $STASHD_CLIENT_LIB={path!r} cannot be loaded ({e}); point it at "
                    f"a built {LIBRARY_NAME} or unset it") from e
        if "*" in path or not os.path.exists(path):
            tried.append(f"  {path} ({origin}): not there")
            continue
        try:
            return _declare(ctypes.CDLL(path))
        except (OSError, AttributeError) as e:
            tried.append(f"  {path} ({origin}): {e}")
    system = ctypes.util.find_library("stash_client") or LIBRARY_NAME
    try:
        return _declare(ctypes.CDLL(system))
    except (OSError, AttributeError) as e:
        tried.append(f"  {system} (the dynamic loader's search path): {e}")
    raise LibraryNotFound(
        f"stashd: cannot load {LIBRARY_NAME}. Tried:\n" + "\n".join(tried) +
        "\nBuild it (cmake --preset release && cmake --build build/release --target "
        "stash_client) or set STASHD_CLIENT_LIB to the file.")


_lib: Optional[ctypes.CDLL] = None
_lib_lock = threading.Lock()


def lib() -> ctypes.CDLL:
    """The loaded library (loaded on first use, so `import stashd` never fails)."""
    global _lib
    if _lib is None:
        with _lib_lock:
            if _lib is None:
                _lib = _load()
    return _lib


def last_error() -> str:
    """The calling thread's last failure message from the library."""
    raw = lib().stash_last_error()
    return raw.decode("utf-8", "replace") if raw else ""
