"""GPU hooks of the recorder: NVTX ranges for Nsight Systems, and device spans timed by CUDA events.

Both use the array module the recorder was given and never import cupy themselves, so a CPU run (and CPU CI)
never loads it.
"""


def is_cupy(xp):
    return getattr(xp, "__name__", "") == "cupy"


def ranges(xp):
    """cupy's ``cupy.cuda.nvtx`` module (``RangePush(name)`` / ``RangePop()``) when ``xp`` is cupy and was built
    with NVTX; else None (numpy, or a cupy without NVTX)."""
    if not is_cupy(xp):
        return None
    module = getattr(getattr(xp, "cuda", None), "nvtx", None)
    if module is None:  # a cupy whose cuda package has not imported its nvtx submodule yet
        import importlib

        try:
            module = importlib.import_module("cupy.cuda.nvtx")
        except ImportError:
            return None
    if not getattr(module, "available", True):
        return None
    return module


class DeviceTimer:
    """Device-side spans: a CUDA event pair on the current stream around each span, read back at the end.

    CUDA events give the time between two events, not a clock reading, so the timer records a reference event
    at the start, waits for it, and reads the host clock at once: a device span starts at that host time plus
    the milliseconds from the reference event to the span's first event. The error of this placement is the
    delay between the reference event completing and the host seeing it (a few microseconds plus the time the
    synchronisation call takes to return), the same for every span of the process.

    Args:
        xp: cupy (the module; its ``cuda.Event`` and ``cuda.get_elapsed_time`` are used).
    """

    def __init__(self, xp):
        from .clocks import clock

        self.xp = xp
        self.reference = xp.cuda.Event()
        self.reference.record()
        self.reference.synchronize()
        self.reference_time = clock()
        self.pending = []  # (first event, second event, cat, name, iteration, args)

    def begin(self):
        first = self.xp.cuda.Event()
        first.record()
        return first

    def end(self, first, cat, name, iteration, args):
        second = self.xp.cuda.Event()
        second.record()
        self.pending.append((first, second, cat, name, iteration, args))

    def collect(self, key):
        """The recorded device spans as recorder events on the row ``key``; waits for the device."""
        out = []
        elapsed = self.xp.cuda.get_elapsed_time
        for first, second, cat, name, iteration, args in self.pending:
            second.synchronize()
            start = self.reference_time + elapsed(self.reference, first) / 1e3
            out.append((cat, name, start, elapsed(first, second) / 1e3, key, iteration, args or None))
        self.pending = []
        return out
