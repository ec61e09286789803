"""One array module for CPU and GPU code: layers call ``xp = get_array_module(x)``.

numpy is always available; cupy is used only when the caller already holds cupy
arrays, so CPU use never imports cupy.
"""
import sys
import time

import numpy


def get_array_module(*arrays):
    """Return ``cupy`` if any argument is a cupy array, else ``numpy``."""
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        for a in arrays:
            if isinstance(a, cupy.ndarray):
                return cupy
    return numpy


def data_address(a):
    """The address of an array's first element (cupy or numpy): two arrays are one memory when theirs are equal."""
    return a.data.ptr if hasattr(a.data, "ptr") else a.ctypes.data


def to_numpy(a):
    """A host (numpy) copy or view of ``a``, whichever module it lives in."""
    if isinstance(a, numpy.ndarray):
        return a
    get = getattr(a, "get", None)
    return get() if get is not None else numpy.asarray(a)


def dtype_of(name):
    """``"float32"`` / ``"float64"`` (or a numpy dtype) -> numpy dtype; anything else is an error."""
    dt = numpy.dtype(name)
    if dt not in (numpy.float32, numpy.float64):
        raise ValueError(f"unsupported dtype {dt}; use float32 or float64")
    return dt


def gpu_array_module(device_id=0, what="GPU mode"):
    """``cupy`` with device ``device_id`` made current; a one-line LayerforgeError when cupy or the device is missing."""
    from .errors import LayerforgeError

    try:
        import cupy
        cupy.cuda.Device(device_id).use()
        return cupy
    except Exception as e:  # noqa: BLE001 - any cupy/driver failure is one user-facing line
        raise LayerforgeError(no_device(f"{what} (device_id {device_id})", e, device_id)) from None


# CUDA's answers when there is no device to use: no driver, a driver older than cupy's runtime, no GPU
NO_DEVICE_ERRORS = ("cudaErrorInsufficientDriver", "cudaErrorNoDevice", "cudaErrorInitializationError",
                    "cudaErrorCompatNotSupportedOnDevice", "cudaErrorSystemDriverMismatch", "libcuda")
GPU_NEEDS = ("--gpu needs an NVIDIA GPU with its driver and cupy for its CUDA (pip install -e '.[gpu]': "
             "cupy-cuda13x); without --gpu and solver_mode GPU layerforge runs on the CPU")


def no_device(what, e, device_id=None):
    """The one line for a GPU request (``what``) that cupy could not serve with ``e``: no cupy, no CUDA device or
    no device ``device_id``, and what ``--gpu`` needs; the exception's own words for anything else."""
    text = f"{type(e).__name__}: {e}"
    if isinstance(e, ImportError):
        found = f"cupy cannot be imported ({text})"
    elif any(name in str(e) for name in NO_DEVICE_ERRORS):
        found = f"no CUDA device was found ({e})"
    elif "cudaErrorInvalidDevice" in str(e):
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
        return f"{what}: there is no CUDA device {device_id}: this machine has {count}, so --gpu takes 0 to {count - 1}"
    else:
        return f"{what} needs cupy and a CUDA device: {text}"
    return f"{what} needs cupy and a CUDA device: {found}; {GPU_NEEDS}"


def gpu_count(what="GPU mode"):
    """The number of CUDA devices cupy sees; a one-line LayerforgeError when there are none (or no cupy)."""
    from .errors import LayerforgeError

    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - any cupy/driver failure is one user-facing line
        raise LayerforgeError(no_device(what, e)) from None
    if count < 1:
        raise LayerforgeError(f"{what}: no CUDA device")
    return count


def gpu_name(device_id):
    """The name of CUDA device ``device_id`` as a str (cupy gives bytes on some versions)."""
    import cupy
    name = cupy.cuda.runtime.getDeviceProperties(device_id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def rank_device(first, local_rank):
    """The GPU of the ``local_rank``-th rank on a node whose ranks start at GPU ``first``: ``first + local_rank``,
    wrapping around the visible devices (so ranks share GPUs only when there are more ranks than GPUs)."""
    from .errors import LayerforgeError

    if not local_rank:
        return first
    try:
        count = gpu_count()
    except LayerforgeError:  # no cupy or no device: gpu_array_module reports it in one line
        return first
    return (first + local_rank) % count


class Stopwatch:
    """Seconds of array work between :meth:`start` and :meth:`stop`.

    numpy: the host clock (the work is synchronous). cupy: two CUDA events on the current stream, and
    :meth:`stop` waits for the work. On an idle stream (as after a previous :meth:`stop`) the start event
    fires at once, so the figure is the time the work takes to run from this thread, the gaps while Python
    launches it included (what an eager iteration pays), not the host time to queue it.
    """

    def __init__(self, xp=numpy):
        self.xp = xp
        self._events = None
        if xp is not numpy:
            self._events = (xp.cuda.Event(), xp.cuda.Event())
        self._t0 = 0.0

    def start(self):
        if self._events is None:
            self._t0 = time.perf_counter()
        else:
            self._events[0].record()

    def stop(self):
        """Seconds since :meth:`start` (float)."""
        if self._events is None:
            return time.perf_counter() - self._t0
        begin, end = self._events
        end.record()
        end.synchronize()
        return self.xp.cuda.get_elapsed_time(begin, end) / 1000.0
