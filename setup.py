"""The compiled hot path, built with the package: coordinator/chorus/_cwire.pyx, _ccert.pyx,
_csched.pyx and _cproto.pyx (docs/ARCHITECTURE.md, "Compiled parts"). Everything else about the
package is in pyproject.toml; setuptools reads this file only for ``ext_modules``.

A wheel built from the tree has them, as ``scripts/setup.sh`` builds them in place. They are
optional: where they cannot be compiled (no C compiler) the package still builds and runs its
pure-Python references (chorus/impl.py).
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

COMPILED = ("_cwire", "_ccert", "_csched", "_cproto")

setup(ext_modules=cythonize([Extension(f"chorus.{name}", [f"coordinator/chorus/{name}.pyx"], optional=True)
                             for name in COMPILED], language_level=3, quiet=True))
