"""Fixtures of the unit tests."""

from __future__ import annotations

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
