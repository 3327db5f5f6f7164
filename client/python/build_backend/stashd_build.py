"""The build backend of client/python: setuptools, refusing a wheel that could not load its library.

`import stashd` loads libstash_client.so through ctypes, and that library needs gRPC, protobuf and
abseil at run time. A wheel built straight from the checkout (`pip install client/python`) would
carry none of them, install cleanly and then fail at the first connect() on any other machine. So
a wheel is built only from the tree ./scripts/wheel stages, which it marks with stashd/_bundle.py
(the library, its bundled dependencies, stashctl, and the glibc they need). Editable installs stay
allowed: they run from the checkout, where stashd finds the build tree's library.
"""

from __future__ import annotations

import os

from setuptools import build_meta as _setuptools

MARKER = os.path.join("stashd", "_bundle.py")

REFUSAL = (
    "stashd: this directory is the Python client's source, not a wheel: installed on its own it "
    "could not find libstash_client.so and the gRPC, protobuf and abseil libraries it loads. "
    "Build the wheel that carries them and install that:\n"
    "    ./scripts/build release && ./scripts/wheel      # -> build/wheel/stashd-*.whl\n"
    "    pip install build/wheel/stashd-*.whl\n"
    "or, inside the checkout, put client/python on PYTHONPATH (or pip install -e client/python).")


class NotAStagedTree(RuntimeError):
    """Raised by build_wheel outside a tree staged by ./scripts/wheel."""


def _require_staged() -> None:
    if not os.path.isfile(MARKER):
        raise NotAStagedTree(REFUSAL)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _require_staged()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    _require_staged()
    return _setuptools.build_sdist(sdist_directory, config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _require_staged()
    return _setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def get_requires_for_build_wheel(config_settings=None):
    _require_staged()  # pip asks this first: refuse before it fetches or writes anything
    return _setuptools.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    _require_staged()
    return _setuptools.get_requires_for_build_sdist(config_settings)

# PEP 660: an editable install runs from the checkout, where stashd._lib finds the build tree.
build_editable = getattr(_setuptools, "build_editable", None)
get_requires_for_build_editable = getattr(_setuptools, "get_requires_for_build_editable", None)
prepare_metadata_for_build_editable = getattr(_setuptools, "prepare_metadata_for_build_editable",
                                              None)
for _name in ("build_editable", "get_requires_for_build_editable",
              "prepare_metadata_for_build_editable"):
    if globals()[_name] is None:
        del globals()[_name]
