import pytest

import layerforge.pycaffe as caffe


@pytest.fixture(params=["cpu", "gpu"])
def caffe_mode(request):
    """A pycaffe test in CPU mode and in GPU mode (``caffe.set_mode_gpu()``: a device, or the emulated one of
    tests/conftest.py); CPU mode again afterwards, pycaffe's default."""
    (caffe.set_mode_gpu if request.param == "gpu" else caffe.set_mode_cpu)()
    yield request.param
    caffe.set_mode_cpu()
