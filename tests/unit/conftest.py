"""Fixtures of the unit tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from wire_sources import build_wsdump


@pytest.fixture(scope="module")
def wsdump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The extension's dump tool with its C writeset reader (extension/tools/wsdump.c)."""
    tool = build_wsdump(tmp_path_factory.mktemp("wsdump"))
    if tool is None:
        pytest.skip("no C compiler (cc, gcc or clang) to build extension/tools/wsdump.c")
    return tool


@pytest.fixture(scope="session")
def native_core(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The data plane's C core (coordinator/chorus/dataplane/native/), compiled from the sources
    as they are now into a directory of the session's and bound (dataplane/native.py), so that a
    module built in place earlier cannot stand in for changed sources. Without cffi or a C
    compiler, a module built in place is used, else the tests that need it are skipped; a
    compile error fails them."""
    import importlib.util
    import shutil

    from chorus.dataplane import native

    try:
        from chorus.dataplane import build
    except ImportError as e:
        build = None
        why = f"no cffi ({e})"
    else:
        why = "no C compiler (cc, gcc or clang)"
    if build is None or not any(shutil.which(cc) for cc in ("cc", "gcc", "clang")):
        if not native.available():
            pytest.skip(f"the data plane's C core cannot be built here: {why}")
        return
    # CHORUS_NATIVE_SANITIZE=1: built with AddressSanitizer, for a run under
    # LD_PRELOAD=$(gcc -print-file-name=libasan.so) PYTHONMALLOC=malloc ASAN_OPTIONS=detect_leaks=0
    path = build.compile_into(tmp_path_factory.mktemp("native"),
                              sanitize=os.environ.get("CHORUS_NATIVE_SANITIZE") == "1")
    spec = importlib.util.spec_from_file_location("chorus.dataplane._native", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    native.use(module)
