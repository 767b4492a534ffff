"""Settings for every test."""

from hypothesis import settings

# Property tests check behaviour, not speed: no per-example deadline (on a loaded machine a
# slow example is not a failure; benchmarks under bench/ measure speed).
settings.register_profile("splitflow", deadline=None)
settings.load_profile("splitflow")
