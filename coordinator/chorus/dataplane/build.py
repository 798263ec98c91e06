"""The cffi builder of the data plane's native core (docs/NATIVE.md section 3.1): API mode, out of
line, from the plain C under ``native/`` (no Python.h), as the module ``chorus.dataplane._native``.

Optional, as the Cython modules are (chorus/impl.py): nothing on the coordinator's path imports it
yet, and :mod:`chorus.dataplane.native` says whether it is there. Built in place by running this
file (``python coordinator/chorus/dataplane/build.py``); the unit tests and the micro-benchmark
build it into a directory of their own with :func:`compile_into` when it is not.

The cdef is ``native/ch_core.h`` itself with its preprocessor lines dropped, so the header and the
binding cannot drift; the one addition is the callback the scheduler's ``fits`` goes through.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from cffi import FFI  # type: ignore[import-untyped]

HERE = Path(__file__).resolve().parent
NATIVE = HERE / "native"
EXTENSION = HERE.parents[2] / "extension"  # chorus_wire.h: the key modes
SOURCES = ("mem.c", "cert.c", "sched.c")
MODULE = "chorus.dataplane._native"

# the scheduler calls ``fits`` through this (dataplane/native.py defines it)
CALLBACKS = 'extern "Python" int ch_py_fits(void *, const uint64_t *, size_t);'


def cdef() -> str:
    """ch_core.h as cffi reads it: the declarations, without #include, #ifndef and the like."""
    lines = (NATIVE / "ch_core.h").read_text().splitlines()
    return "\n".join(line for line in lines if not line.lstrip().startswith("#")) + "\n" + CALLBACKS


def builder() -> FFI:
    ffi = FFI()
    ffi.cdef(cdef())
    ffi.set_source(MODULE, '#include "ch_core.h"\n',
                   sources=[str(NATIVE / s) for s in SOURCES],
                   include_dirs=[str(NATIVE), str(EXTENSION)],
                   extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra"])
    return ffi


def compile_into(directory: Path) -> Path:
    """Build the module under ``directory`` (its work files too); the path of the built module."""
    return Path(builder().compile(tmpdir=str(directory)))


def compile_in_place() -> Path:
    """Build the module next to this file, where ``import chorus.dataplane._native`` finds it."""
    with tempfile.TemporaryDirectory(prefix="chorus-native-") as work:
        built = compile_into(Path(work))
        target = HERE / built.name
        shutil.copyfile(built, target)
    return target


ffibuilder = builder()  # for setuptools' cffi_modules, when setup.py names it

if __name__ == "__main__":
    print(compile_in_place(), file=sys.stderr)
