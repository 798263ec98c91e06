"""Which implementation of the hot path runs: the compiled modules (Cython: ``_cwire``, ``_ccert``,
``_csched``, ``_cproto``) or their pure-Python references (docs/ARCHITECTURE.md, "Compiled parts").

The compiled one when it is built, unless ``CHORUS_IMPL=python``; ``CHORUS_IMPL=c`` insists on it
(an import error when it is not built). A built module is loaded either way, so that the tests
compare both.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Optional


def wanted() -> str:
    """``CHORUS_IMPL``: "" (the compiled one if built), "c" or "python"."""
    want = os.environ.get("CHORUS_IMPL", "").strip().lower()
    if want not in ("", "c", "python"):
        raise ImportError(f"CHORUS_IMPL={want!r}: expected c or python")
    return want


def compiled(name: str) -> Optional[ModuleType]:
    """The compiled module ``chorus.<name>`` if it is built (None if not, unless CHORUS_IMPL=c)."""
    want = wanted()
    try:
        return importlib.import_module(f"chorus.{name}")
    except ImportError:
        if want == "c":
            raise
        return None


def chosen(module: Optional[ModuleType]) -> str:
    """"c" when the compiled ``module`` (from :func:`compiled`) runs, else "python"."""
    return "c" if module is not None and wanted() != "python" else "python"
