import numpy
import pytest

from layerforge import rng

BACKENDS = ["numpy"]
try:  # cupy runs the same bodies on a device when one is present
    import cupy

    cupy.cuda.runtime.getDeviceCount()
    BACKENDS.append("cupy")
except Exception:  # noqa: BLE001 - no cupy, no driver or no device: CPU only
    pass


@pytest.fixture(params=BACKENDS)
def xp(request):
    """The array module a test body runs on: numpy, and cupy where a device is present."""
    if request.param == "cupy":
        import cupy
        return cupy
    return numpy


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same random stream."""
    rng.seed(1234)
    yield
