"""The compiled hot path, built with the package: coordinator/chorus/_cwire.pyx, _ccert.pyx,
_csched.pyx and _cproto.pyx (docs/ARCHITECTURE.md, "Compiled parts"), and the data plane's C core
``chorus.dataplane._native`` (cffi, coordinator/chorus/dataplane/build.py; docs/NATIVE.md). Everything
else about the package is in pyproject.toml; setuptools reads this file only for ``ext_modules``.

A wheel built from the tree has them, as ``scripts/setup.sh`` builds them in place. They are
optional: where they cannot be compiled (no C compiler, no cffi) the package still builds and runs
its pure-Python references (chorus/impl.py, chorus/dataplane/native.py).
"""

import importlib.util
import os
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup

COMPILED = ("_cwire", "_ccert", "_csched", "_cproto")
ROOT = Path(__file__).resolve().parent


def native() -> list[Extension]:
    """The C core as cffi's builder (dataplane/build.py) describes it, its paths relative to the tree
    (setuptools wants them so); none without cffi or without the extension's reader beside it."""
    build = ROOT / "coordinator" / "chorus" / "dataplane" / "build.py"
    if importlib.util.find_spec("cffi") is None or not (ROOT / "extension" / "chorus_wsread.c").exists():
        return []
    spec = importlib.util.spec_from_file_location("_chorus_native_build", build)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ext: Extension = module.ffibuilder.distutils_extension(str(ROOT / "build" / "native"))
    ext.sources = [os.path.relpath(s, ROOT) for s in ext.sources]
    ext.include_dirs = [os.path.relpath(d, ROOT) for d in ext.include_dirs]
    ext.optional = True
    return [ext]


# Cython and the C compiler on every core: the four modules are independent
JOBS = len(os.sched_getaffinity(0))

setup(ext_modules=cythonize([Extension(f"chorus.{name}", [f"coordinator/chorus/{name}.pyx"], optional=True)
                             for name in COMPILED], language_level=3, quiet=True, nthreads=JOBS) + native(),
      options={"build_ext": {"parallel": JOBS}})
