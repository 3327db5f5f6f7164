"""tests/layout/check_layout.py against small trees made here: each rule fails when broken."""

import os
import subprocess
import sys

import pytest

CHECK = os.path.join(os.path.dirname(__file__), "check_layout.py")


def make_tree(root, files):
    for path, text in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)
    subprocess.run(["git", "init", "-q", root], check=True)
    subprocess.run(["git", "-C", root, "add", "-A"], check=True)


def run(root):
    p = subprocess.run([sys.executable, CHECK, root], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


CLEAN = {
    "common/base.h": "#pragma once\n",
    "daemon/tiers/tier.h": '#include "common/base.h"\n',
    "daemon/copy/pool.h": '#include "daemon/tiers/tier.h"\n',
    "client/python/stashd/__init__.py": "from stashd.client import Client\n",
    "client/python/stashd/client.py": "import ctypes\nClient = object\n",
    "client/python/stashd/torch/__init__.py": "import stashd.client\n",
}


def test_a_clean_tree_passes(tmp_path):
    make_tree(str(tmp_path), CLEAN)
    code, out = run(str(tmp_path))
    assert code == 0, out


@pytest.mark.parametrize("extra, says", [
    ({"daemon/tiers/tier.h": '#include "daemon/copy/pool.h"\n'},
     "folder cycle daemon/copy -> daemon/tiers -> daemon/copy"),
    ({"common/base.h": '#include "client/api/x.h"\n', "client/api/x.h": "\n"},
     "common/ is base code and may not include client/"),
    ({"client/api/x.h": '#include "daemon/copy/pool.h"\n'},
     "daemon/ and client/ meet only in"),
    ({"daemon/copy/big.cc": "int x;\n" * 801}, "daemon/copy/big.cc: 801 lines"),
    ({f"daemon/flat/f{i}.cc": "\n" for i in range(21)}, "daemon/flat/: 21 source files"),
    ({"client/python/stashd/client.py": "def f():\n    from stashd import torch\n"},
     "Python import cycle"),
    ({"client/python/stashd/buffer.py": "import stashd.torch\n"},
     "the core package imports stashd.torch"),
])
def test_each_rule_fails_when_broken(tmp_path, extra, says):
    make_tree(str(tmp_path), {**CLEAN, **extra})
    code, out = run(str(tmp_path))
    assert code == 1
    assert says in out, out


def test_type_checking_imports_are_not_edges(tmp_path):
    files = {**CLEAN, "client/python/stashd/client.py":
             "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import stashd\n"}
    make_tree(str(tmp_path), files)
    code, out = run(str(tmp_path))
    assert code == 0, out


def test_this_checkout_passes():
    code, out = run(os.path.join(os.path.dirname(__file__), "..", ".."))
    assert code == 0, out
