from concurrent.futures import ThreadPoolExecutor

import numpy
import pytest

from layerforge.kernels import cuda
from tests.kernels.emulator.helpers import DTYPES, module


def _build_all(tmp_path_factory, jobs):
    # the compiler is most of these tests' cost: two builds at a time, into a cache of the session's own
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAYERFORGE_CACHE_DIR", str(tmp_path_factory.mktemp("emulated_gpu_cache")))
        with ThreadPoolExecutor(max_workers=2) as pool:
            for future in [pool.submit(job) for job in jobs]:
                future.result()


@pytest.fixture(scope="session")
def built_kernels(tmp_path_factory):
    """layerforge's kernel sources, built for the emulated device in both dtypes."""
    _build_all(tmp_path_factory, [lambda s=stem, d=dtype: module(s, d) for stem in cuda.sources() for dtype in DTYPES])


@pytest.fixture(scope="session")
def sanitized_kernels(tmp_path_factory):
    """layerforge's kernel sources in float32, built with each sanitizer."""
    _build_all(tmp_path_factory, [lambda s=stem, z=sanitizer: module(s, numpy.float32, z).sanitized_executable()
                                  for sanitizer in ("thread", "address") for stem in cuda.sources()])
