import pytest

from layerforge import trace


@pytest.fixture(autouse=True)
def _no_recorder_left():
    """Every test starts and ends with tracing off (the recorder is process-wide state)."""
    trace.stop()
    yield
    trace.stop()
