"""`python -m stashd`: what a trainer on this node would get from stashd.connect(), in one report.

It prints the package version, the library it loads (path and version), the socket it would
use and whether it is there, whether a daemon answers on it, and that session's stats. The exit
status is 0 only when a daemon answered: usable as a job's pre-flight check.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from typing import Any, Dict, List, Optional

SYSTEM_SOCKET = "/run/stashd/stashd.sock"


def user_socket_path() -> str:
    """The per-user fallback the daemon uses when /run/stashd is not writable (socket_path.h)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.access(xdg, os.W_OK):
        return os.path.join(xdg, "stashd", "stashd.sock")
    return f"/tmp/stashd-{os.getuid()}/stashd.sock"


def client_socket_path(explicit: Optional[str] = None) -> str:
    """The socket connect() uses, by the library's rule (common/socket_path.cc
    ClientSocketPath): the argument, $STASHD_SOCKET, the system socket when it exists, the
    per-user one when it exists, else the system path."""
    if explicit:
        return explicit
    env = os.environ.get("STASHD_SOCKET")
    if env:
        return env
    if os.path.exists(SYSTEM_SOCKET):
        return SYSTEM_SOCKET
    user = user_socket_path()
    if os.path.exists(user):
        return user
    return SYSTEM_SOCKET


def _socket_state(path: str) -> str:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "missing"
    except PermissionError:
        return "not readable (permission denied on its directory)"
    if not stat.S_ISSOCK(st.st_mode):
        return "not a socket"
    return "present"


def report(socket: Optional[str], timeout_ms: int) -> Dict[str, Any]:
    """The facts as a dict; "daemon" is "reachable" only when a session opened."""
    import stashd
    from stashd import _lib

    out: Dict[str, Any] = {"version": stashd.__version__}
    try:
        lib = _lib.lib()
        out["library"] = lib._name
        out["library_version"] = stashd.version()
    except _lib.LibraryNotFound as e:
        out["library"] = None
        out["library_error"] = str(e)
    path = client_socket_path(socket)
    out["socket"] = path
    out["socket_source"] = ("argument" if socket else
                            "$STASHD_SOCKET" if os.environ.get("STASHD_SOCKET") else "default")
    out["socket_state"] = _socket_state(path)
    out["daemon"] = "not tried"
    from stashd.disabled import disabled_reason
    reason = disabled_reason()
    if reason is not None:
        out["daemon"] = "disabled"
        out["daemon_error"] = reason
        return out
    if out["library"] is None:
        return out
    try:
        client = stashd.connect(socket=path, label="python -m stashd",
                                connect_timeout_ms=timeout_ms)
    except stashd.StashError as e:
        out["daemon"] = "unreachable"
        out["daemon_error"] = str(e)
        return out
    try:
        out["daemon"] = "reachable"
        stats = client.stats()
        out["stats"] = {name: getattr(stats, name) for name in _lib.STATS_FIELDS}
    finally:
        client.close()
    return out


def _text(facts: Dict[str, Any]) -> List[str]:
    lines = [f"stashd {facts['version']}"]
    if facts["library"] is None:
        lines.append(f"library: NOT FOUND\n{facts['library_error']}")
    else:
        lines.append(f"library: {facts['library']} ({facts['library_version']})")
    lines.append(f"socket: {facts['socket']} ({facts['socket_source']}; "
                 f"{facts['socket_state']})")
    daemon = facts["daemon"]
    if "daemon_error" in facts:
        daemon += f": {facts['daemon_error']}"
    lines.append(f"daemon: {daemon}")
    stats = facts.get("stats")
    if stats:
        page = stats["page_bytes"]
        lines.append(f"page size: {page} bytes")
        lines.append(f"pool: {stats['pool_pages_used']}/{stats['pool_pages_total']} pages used "
                     f"(high water {stats['pool_pages_high_water']})")
        lines.append(f"host tier: {stats['host_pages_used']}/{stats['host_pages_total']} pages "
                     f"used (high water {stats['host_pages_high_water']})")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stashd",
        description="Reports the stashd package and library versions, the daemon socket a "
                    "trainer would use, whether a daemon answers on it, and its pool usage. "
                    "Exit status 0 only when the daemon answered.")
    parser.add_argument("--socket", help="the daemon's socket (default: $STASHD_SOCKET, else "
                                         "the library's default)")
    parser.add_argument("--timeout-ms", type=int, default=2000,
                        help="how long to wait for the daemon (default 2000)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of text")
    args = parser.parse_args(argv)
    if args.timeout_ms < 0:
        parser.error(f"--timeout-ms must be >= 0, got {args.timeout_ms}")
    facts = report(args.socket, args.timeout_ms)
    if args.json:
        print(json.dumps(facts, indent=2, sort_keys=True))
    else:
        print("\n".join(_text(facts)))
    return 0 if facts["daemon"] == "reachable" else 1


if __name__ == "__main__":
    sys.exit(main())
