"""tests/gpu run only where CUDA sees an NVIDIA GPU; elsewhere every test is skipped with why."""
import pytest

from clockalign.capture.clocks.gpuclock import gpu_clock_available

_OK, _REASON = gpu_clock_available()


def pytest_runtest_setup(item):
    # A hook, not an autouse fixture, so it runs before module-scoped GPU fixtures do.
    if not _OK:
        pytest.skip(f"no NVIDIA GPU: {_REASON}")
