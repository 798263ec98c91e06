"""What the wire format's tests read from the sources that hold a copy of its constants: the
extension's header (extension/chorus_wire.h), the C reader's failures (extension/chorus_wsread.h
and .c) and the compiled modules' ``cdef enum`` blocks (coordinator/chorus/*.pyx); and the C
reader built into the extension's dump tool (extension/tools/wsdump.c)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
EXTENSION = ROOT / "extension"
HEADER = EXTENSION / "chorus_wire.h"
COMPILED = ROOT / "coordinator" / "chorus"


def header_defines() -> dict[str, object]:
    """The CHORUS_* constants of chorus_wire.h: strings as bytes, characters as str, numbers
    (their expressions evaluated)."""
    out: dict[str, object] = {}
    for name, value in re.findall(r"^#define[ \t]+(CHORUS_\w+)[ \t]+([^\n]+?)[ \t]*(?:/\*[^\n]*)?$",
                                  HEADER.read_text(), re.M):
        value = value.strip()
        if value.startswith('"'):
            out[name] = value.strip('"').encode()
        elif value.startswith("'"):
            out[name] = value.strip("'")
        else:
            expr = re.sub(r"CHORUS_\w+", lambda m: repr(out[m.group(0)]), value)
            out[name] = eval(expr, {})  # noqa: S307 - integer arithmetic from our own header
    return out


def c_reader_failures() -> list[str]:
    """The C reader's failures (enum ChorusWsrError, without CHORUS_WSR_OK), in order, by the
    name after CHORUS_WSR_."""
    header = (EXTENSION / "chorus_wsread.h").read_text()
    body = re.search(r"typedef enum ChorusWsrError\s*\{(.*?)\}\s*ChorusWsrError;", header, re.S)
    assert body is not None
    names = re.findall(r"\bCHORUS_WSR_(\w+)", re.sub(r"/\*.*?\*/", "", body.group(1), flags=re.S))
    return [n for n in names if n != "OK"]


def c_reader_texts() -> dict[str, str]:
    """chorus_wsr_error_text's words for each failure."""
    return dict(re.findall(r'case CHORUS_WSR_(\w+):\s*return "([^"]*)";', (EXTENSION / "chorus_wsread.c").read_text()))


def pyx_enum(module: str) -> dict[str, int]:
    """The names and values of the ``cdef enum`` blocks of coordinator/chorus/<module>.pyx."""
    out: dict[str, int] = {}
    for block in re.findall(r"^cdef enum:\n((?:[ \t]+[^\n]*\n)+)", (COMPILED / f"{module}.pyx").read_text(), re.M):
        for name, value in re.findall(r"^[ \t]+(\w+)[ \t]*=[ \t]*(0x[0-9A-Fa-f]+|\d+)", block, re.M):
            out[name] = int(value, 0)
    return out


def build_wsdump(directory: Path) -> Optional[Path]:
    """The dump tool with the C reader, built with the system C compiler (None without one)."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None
    out = directory / "wsdump"
    subprocess.run([cc, "-std=c99", "-O1", "-Wall", "-Wextra", "-o", str(out),
                    str(EXTENSION / "tools" / "wsdump.c"), str(EXTENSION / "chorus_wsread.c")],
                   check=True, capture_output=True, text=True)
    return out
