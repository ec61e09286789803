"""The emulated cupy as a fixture, installed in this process for one test (tests/emulator)."""
import pytest

from layerforge_emulator import runtime
from layerforge_emulator.install import installed


@pytest.fixture
def cupy():
    """The emulated ``cupy`` module in ``sys.modules`` for the test; device 0 current before and after."""
    with installed() as module:
        runtime.setDevice(0)
        yield module
        runtime.setDevice(0)
