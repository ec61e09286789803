"""``cupy.cuda.Device`` on the emulated devices (runtime.py holds the current device and the properties)."""
import threading

from . import runtime, streams
from .allocations import mem_info
from .runtime import check_device, getDevice, setDevice


class Device:
    """``Device(i)`` names device i (the current one when None); ``use()`` makes it current for the calling
    thread, ``with Device(i):`` does so until the block ends; ``synchronize()`` waits for all its work.
    An ordinal the emulator does not have raises ``cudaErrorInvalidDevice`` when used, as CUDA's."""

    _local = threading.local()

    def __init__(self, device=None):
        self.id = getDevice() if device is None else int(device)

    def __int__(self):
        return self.id

    def __enter__(self):
        self._local.__dict__.setdefault("stack", []).append(getDevice())
        if self.id != getDevice():
            setDevice(self.id)
        return self

    def __exit__(self, *args):
        setDevice(self._local.stack.pop())

    def __repr__(self):
        return f"<CUDA Device {self.id}>"

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    def use(self):
        setDevice(self.id)
        return self

    def synchronize(self):
        streams.synchronize_device(check_device(self.id))

    @property
    def compute_capability(self):
        check_device(self.id)
        return "%d%d" % runtime.COMPUTE_CAPABILITY

    @property
    def mem_info(self):
        return mem_info(check_device(self.id))


def get_device_id():
    return getDevice()


def get_compute_capability():
    return Device().compute_capability
