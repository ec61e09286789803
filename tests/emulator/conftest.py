from concurrent.futures import ThreadPoolExecutor

import numpy
import pytest

from layerforge.kernels import cuda
from tests.emulator.helpers import DTYPES, module


def _build_all(jobs):
    # the compiler is most of these tests' cost: two builds at a time, into the session's build directory
    # (tests/conftest.py)
    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(job) for job in jobs]:
            future.result()


@pytest.fixture(scope="session")
def built_kernels():
    """layerforge's kernel sources, built for the emulated device in both dtypes."""
    _build_all([lambda s=stem, d=dtype: module(s, d) for stem in cuda.sources() for dtype in DTYPES])


@pytest.fixture(scope="session")
def sanitized_kernels():
    """layerforge's kernel sources in float32, built with each sanitizer."""
    _build_all([lambda s=stem, z=sanitizer: module(s, numpy.float32, z).sanitized_executable()
                for sanitizer in ("thread", "address") for stem in cuda.sources()])
