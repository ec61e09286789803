"""``cupy.cuda.runtime`` of the emulated devices: how many, their memory, their properties, the current device,
and CUDA's errors.

Configuration (read once, at the first use):

- ``LAYERFORGE_EMULATED_GPU_DEVICES``: number of devices (default 2, so ``--devices 0,1`` and two-rank runs
  find two);
- ``LAYERFORGE_EMULATED_GPU_MEMORY``: memory per device in bytes, with an optional K/M/G suffix (default
  4G). Allocations beyond it fail as ``cudaMalloc`` does, and cupy's pool turns that into
  ``OutOfMemoryError``.

The current device is per host thread, as in CUDA (``cudaSetDevice``).
"""
import os
import threading

DEVICES_ENV, MEMORY_ENV = "LAYERFORGE_EMULATED_GPU_DEVICES", "LAYERFORGE_EMULATED_GPU_MEMORY"
DEFAULT_DEVICES, DEFAULT_MEMORY = 2, 4 << 30
NAME = b"Emulated CUDA device (layerforge)"
COMPUTE_CAPABILITY = (9, 0)
RUNTIME_VERSION = DRIVER_VERSION = 13000

# cudaError_t values the emulator raises, with cudaGetErrorName / cudaGetErrorString
errorInvalidValue, errorMemoryAllocation, errorInvalidDevice, errorInvalidResourceHandle = 1, 2, 101, 400
errorIllegalState, errorNotReady, errorIllegalAddress = 401, 600, 700
errorHostMemoryAlreadyRegistered, errorHostMemoryNotRegistered = 712, 713
errorStreamCaptureUnsupported, errorStreamCaptureInvalidated, errorStreamCaptureUnjoined = 900, 901, 904
errorStreamCaptureIsolation, errorStreamCaptureImplicit, errorCapturedEvent = 905, 906, 907
ERRORS = {
    errorInvalidValue: ("cudaErrorInvalidValue", "invalid argument"),
    errorMemoryAllocation: ("cudaErrorMemoryAllocation", "out of memory"),
    errorInvalidDevice: ("cudaErrorInvalidDevice", "invalid device ordinal"),
    errorInvalidResourceHandle: ("cudaErrorInvalidResourceHandle", "invalid resource handle"),
    errorIllegalState: ("cudaErrorIllegalState", "the operation cannot be performed in the present state"),
    errorNotReady: ("cudaErrorNotReady", "device not ready"),
    errorIllegalAddress: ("cudaErrorIllegalAddress", "an illegal memory access was encountered"),
    errorHostMemoryAlreadyRegistered: ("cudaErrorHostMemoryAlreadyRegistered",
                                       "part or all of the requested memory range is already mapped"),
    errorHostMemoryNotRegistered: ("cudaErrorHostMemoryNotRegistered",
                                   "pointer does not correspond to a registered memory region"),
    errorStreamCaptureUnsupported: ("cudaErrorStreamCaptureUnsupported",
                                    "operation not permitted when stream is capturing"),
    errorStreamCaptureInvalidated: ("cudaErrorStreamCaptureInvalidated",
                                    "operation failed due to a previous error during capture"),
    errorStreamCaptureUnjoined: ("cudaErrorStreamCaptureUnjoined", "capturing stream has unjoined work"),
    errorStreamCaptureIsolation: ("cudaErrorStreamCaptureIsolation",
                                  "dependency created on uncaptured work in another stream"),
    errorStreamCaptureImplicit: ("cudaErrorStreamCaptureImplicit",
                                 "operation would make the legacy stream depend on a capturing blocking stream"),
    errorCapturedEvent: ("cudaErrorCapturedEvent",
                         "operation not permitted on an event last recorded in a capturing stream"),
}


class CUDARuntimeError(RuntimeError):
    """cupy's ``CUDARuntimeError``: ``status`` is the cudaError_t, the message ``"<name>: <description>"``."""

    def __init__(self, status):
        self.status = status
        name, text = ERRORS.get(status, ("cudaErrorUnknown", "unknown error"))
        super().__init__(f"{name}: {text}")

    def __reduce__(self):
        return type(self), (self.status,)


def _bytes(text):
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


class _Config:
    """The device count and memory size, from the environment at first use."""

    def __init__(self):
        self.count, self.memory = None, None

    def load(self):
        if self.count is None:
            self.count = int(os.environ.get(DEVICES_ENV) or DEFAULT_DEVICES)
            self.memory = _bytes(os.environ.get(MEMORY_ENV) or str(DEFAULT_MEMORY))
            if self.count < 1 or self.memory < 1:
                raise ValueError(f"{DEVICES_ENV} and {MEMORY_ENV} must be positive "
                                 f"(got {self.count} devices of {self.memory} bytes)")
        return self


CONFIG = _Config()
_local = threading.local()


def getDeviceCount():
    return CONFIG.load().count


def check_device(device_id):
    """``device_id`` as an int, or ``cudaErrorInvalidDevice`` as CUDA raises for an ordinal it does not have."""
    device_id = int(device_id)
    if not 0 <= device_id < getDeviceCount():
        raise CUDARuntimeError(errorInvalidDevice)
    return device_id


def getDevice():
    """The calling thread's current device (0 until it sets one)."""
    return getattr(_local, "device", 0)


def setDevice(device):
    _local.device = check_device(device)


def getDeviceProperties(device):
    """A subset of ``cudaDeviceProp`` (cupy's dict), those of an H100 where they matter to launch checks."""
    device_id = check_device(device)
    major, minor = COMPUTE_CAPABILITY
    return {"name": NAME, "totalGlobalMem": CONFIG.load().memory, "sharedMemPerBlock": 48 << 10,
            "sharedMemPerBlockOptin": 227 << 10, "regsPerBlock": 65536, "warpSize": 32,
            "maxThreadsPerBlock": 1024, "maxThreadsDim": (1024, 1024, 64),
            "maxGridSize": (2 ** 31 - 1, 65535, 65535), "multiProcessorCount": 132, "major": major,
            "minor": minor, "pciBusID": device_id, "pciDeviceID": 0, "pciDomainID": 0,
            "computeMode": 0, "concurrentKernels": 1, "unifiedAddressing": 1}


def runtimeGetVersion():
    return RUNTIME_VERSION


def driverGetVersion():
    return DRIVER_VERSION
