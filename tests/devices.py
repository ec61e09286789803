"""The GPUs the tests have: the emulated device's (2 unless LAYERFORGE_EMULATED_GPU_DEVICES says otherwise) where
there is no real one (tests/conftest.py), else the machine's. Tests of work spread over two devices use the second
where there is one; NCCL, which takes one device per rank, needs two."""
import pytest


def gpu_count():
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


def two_devices():
    """``--devices`` for two workers: ``0,1``, or ``0,0`` (both on one device) on a machine with one GPU."""
    return "0,1" if gpu_count() > 1 else "0,0"


needs_two_gpus = pytest.mark.skipif(gpu_count() < 2, reason="NCCL takes a device per rank; this machine has one GPU")
