"""Settings shared by every test directory."""

import os
import shutil
import tempfile

import pytest
from hypothesis import settings

from chorus.testkit.localcluster import INITDB_CACHE

_INITDB_MADE = pytest.StashKey[str]()

# Property tests check answers, never speed: hypothesis's default 200 ms deadline per example is a
# timed assertion, and on a shared, loaded machine it fails examples that are merely slow (a run saw
# test_impl's writeset reader miss it once). Examples still end: pytest-timeout bounds each test.
settings.register_profile("chorus", deadline=None)
settings.load_profile("chorus")


def pytest_configure(config: pytest.Config) -> None:
    """Every local cluster and plain PostgreSQL a test starts copies one kept initdb instead of
    running its own (chorus.testkit.localcluster.init_pgdata): the directory, made here, is removed
    at the end of the run. One the environment names already is used as it is, and kept."""
    if os.environ.get(INITDB_CACHE):
        return
    directory = tempfile.mkdtemp(prefix="chorus-initdb-", dir="/tmp")
    os.chmod(directory, 0o755)  # the service user passes through to its initdb's directory
    os.environ[INITDB_CACHE] = directory
    config.stash[_INITDB_MADE] = directory


def pytest_unconfigure(config: pytest.Config) -> None:
    directory = config.stash.get(_INITDB_MADE, None)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)
        os.environ.pop(INITDB_CACHE, None)
