# The compiled writeset reader (_cwire.pyx); wire.py is its only user.
from types import ModuleType

from chorus.wire import Writeset

def bind(wire: ModuleType) -> None: ...
def read(buf: bytes, full: bool) -> Writeset: ...
