"""check.sh's PyTorch step (tests/gpu/torch_cuda_check.py) tells a missing torch (a skip, exit 2)
from a torch that is there and fails to load (a failure, exit 1): a torch that cannot load its
libraries (say an older libstdc++ found first) must not read as "no CUDA-enabled torch".
No daemon and no torch needed: the script stops at the import."""

import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), os.pardir, "gpu", "torch_cuda_check.py")


def run_check(tmp_path, prelude=""):
    """Runs the script's main with `tmp_path` first on the import path, after `prelude`."""
    code = (f"import runpy, sys\n{prelude}\nsys.argv = [{SCRIPT!r}]\n"
            f"runpy.run_path({SCRIPT!r}, run_name='__main__')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)


def test_a_missing_torch_module_is_a_skip(tmp_path):
    run = run_check(tmp_path, "sys.modules['torch'] = None  # import torch: ModuleNotFoundError")
    assert run.returncode == 2, run.stdout + run.stderr
    assert "no torch on this machine" in run.stdout


def test_a_torch_that_fails_to_load_its_libraries_is_a_failure(tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        "raise ImportError(\"/opt/bundle/lib/libstdc++.so.6: version `GLIBCXX_3.4.32' not found\")\n")
    run = run_check(tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "import torch failed" in run.stdout and "GLIBCXX_3.4.32" in run.stdout, run.stdout


def test_a_torch_missing_a_module_of_its_own_is_a_failure(tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("import torch_dependency_that_is_not_there\n")
    run = run_check(tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "torch_dependency_that_is_not_there" in run.stdout, run.stdout
