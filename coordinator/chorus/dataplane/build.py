"""The cffi builder of the data plane's native core (docs/NATIVE.md section 3.1): API mode, out of
line, from the plain C under ``native/`` (no Python.h), as the module ``chorus.dataplane._native``.

Optional, as the Cython modules are (chorus/impl.py): :mod:`chorus.dataplane.native` says whether it
is there, and the coordinator runs the C order core when it is (``native.IMPL``). ``setup.py`` builds
it with the package (cffi's ``distutils_extension``), ``scripts/setup.sh`` in place. Built in place by running this
file (``python coordinator/chorus/dataplane/build.py``); the unit tests and the micro-benchmark
build it into a directory of their own with :func:`compile_into` when it is not.

The cdef is ``native/ch_core.h`` and ``native/ch_cpg.h`` themselves with their preprocessor lines
dropped, so the headers and the binding cannot drift; the additions are the callbacks the
scheduler's ``fits`` and the order core's schema-change round go through. The extension's writeset
reader (``extension/chorus_wsread.c``) is compiled in from ``extension/``. ``native/bus_cpg.c``, the
CPG member of the C engine's bus (bus/corosync.py), links Corosync's ``libcpg``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from cffi import FFI  # type: ignore[import-untyped]

HERE = Path(__file__).resolve().parent
NATIVE = HERE / "native"
EXTENSION = HERE.parents[2] / "extension"  # chorus_wire.h (the constants), chorus_wsread.c (the reader)
SOURCES = ("mem.c", "cert.c", "sched.c", "blake2b.c", "scan.c", "order.c", "text.c", "outcomes.c", "bus_cpg.c")
HEADERS = ("ch_core.h", "ch_cpg.h")  # the cdef: the core's API, and the CPG member's (bus_cpg.c)
LIBRARIES = ("cpg",)  # bus_cpg.c: Corosync's libcpg (Debian's libcpg-dev, scripts/setup.sh)
# the extension's writeset reader, compiled in (not copied): one reader of the format in C
EXTENSION_SOURCES = ("chorus_wsread.c",)
MODULE = "chorus.dataplane._native"

# the scheduler calls ``fits``, the order core the control plane's schema-change round, through
# these (dataplane/native.py defines them)
CALLBACKS = ('extern "Python" int ch_py_fits(void *, const uint64_t *, size_t);\n'
             'extern "Python" int ch_py_round(void *, uint64_t, uint32_t);')


def cdef() -> str:
    """The headers as cffi reads them: the declarations, without #include, #ifndef and the like."""
    lines = [line for h in HEADERS for line in (NATIVE / h).read_text().splitlines()]
    return "\n".join(line for line in lines if not line.lstrip().startswith("#")) + "\n" + CALLBACKS


def builder(sanitize: bool = False) -> FFI:
    """The module's builder; ``sanitize``: compiled with AddressSanitizer (the tests' overread
    check, which loads it into an interpreter started with libasan preloaded)."""
    ffi = FFI()
    extra = ["-fsanitize=address", "-fno-omit-frame-pointer", "-O1", "-g"] if sanitize else []
    ffi.cdef(cdef())
    ffi.set_source(MODULE, "".join(f'#include "{h}"\n' for h in HEADERS),
                   sources=[str(NATIVE / s) for s in SOURCES] + [str(EXTENSION / s) for s in EXTENSION_SOURCES],
                   include_dirs=[str(NATIVE), str(EXTENSION)], libraries=list(LIBRARIES),
                   extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra", *extra],
                   extra_link_args=["-fsanitize=address"] if sanitize else [])
    return ffi


def compile_into(directory: Path, sanitize: bool = False) -> Path:
    """Build the module under ``directory`` (its work files too); the path of the built module."""
    return Path(builder(sanitize).compile(tmpdir=str(directory)))


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
