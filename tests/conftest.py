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


@pytest.fixture(autouse=True)
def _fresh_layerforge_logger():
    """Commands run in-process (train, test, time) install the glog handler and stop propagation; undo that, so
    a later test's caplog sees the "layerforge" records again."""
    import logging

    yield
    logger = logging.getLogger("layerforge")
    for handler in [h for h in logger.handlers if getattr(h, "_layerforge", False)]:
        logger.removeHandler(handler)
    logger.propagate = True
    logger.setLevel(logging.NOTSET)


@pytest.fixture(autouse=True)
def _own_engine_cache(tmp_path_factory, monkeypatch):
    """Each test starts with an empty engine-choice cache of its own (never the user's ~/.cache/layerforge), so
    AUTO times the engines as on a first start unless the test itself fills the cache."""
    monkeypatch.setenv("LAYERFORGE_CACHE_DIR", str(tmp_path_factory.mktemp("engine_cache")))
