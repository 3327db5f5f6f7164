"""The `stashctl` command a wheel installs: runs the stashctl binary the wheel carries.

The binary lives in the package (stashd/bin/stashctl, RUNPATH ../lib: the same bundled libraries
as libstash_client.so), so the console script only has to find it and exec it. From a checkout
(PYTHONPATH or an editable install) the build tree's binary is used instead.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional

from stashd import _lib

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def candidate_paths() -> List[str]:
    """Where stashctl is looked for, first hit wins."""
    out = [os.path.join(_PACKAGE_DIR, "bin", "stashctl")]
    bin_dir = os.environ.get("STASHD_BIN_DIR")
    if bin_dir:
        out.append(os.path.join(bin_dir, "client", "stashctl", "stashctl"))
    out.append(os.path.join(_lib._REPO_ROOT, "build", "release", "client", "stashctl", "stashctl"))
    return out


def find() -> Optional[str]:
    for path in candidate_paths():
        if os.access(path, os.X_OK):
            return path
    return None


def main() -> None:
    path = find()
    if path is None:
        tried = "\n".join(f"  {p}" for p in candidate_paths())
        sys.stderr.write(f"stashctl: no stashctl binary in this install. Tried:\n{tried}\n"
                         "Install the wheel that ./scripts/wheel builds, or build the `stashctl` "
                         "target.\n")
        sys.exit(127)
    os.execv(path, [path, *sys.argv[1:]])


if __name__ == "__main__":
    main()
