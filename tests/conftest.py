"""Settings shared by every test directory."""

from hypothesis import settings

# Property tests check answers, never speed: hypothesis's default 200 ms deadline per example is a
# timed assertion, and on a shared, loaded machine it fails examples that are merely slow (a run saw
# test_impl's writeset reader miss it once). Examples still end: pytest-timeout bounds each test.
settings.register_profile("chorus", deadline=None)
settings.load_profile("chorus")
