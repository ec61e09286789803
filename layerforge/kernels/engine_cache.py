"""The on-disk cache of AUTO's convolution engine choices, so a second start skips the timing.

The cache is one JSON file, ``$LAYERFORGE_CACHE_DIR/conv_engines.json`` (default
``$XDG_CACHE_HOME/layerforge``, else ``~/.cache/layerforge``): ``{machine key: {layer key: {"forward": engine,
"backward": engine}}}`` (a direction that never runs, as a TEST net's backward, left out).

- The machine key names what makes one engine faster than another on this computer: the backend (``cpu``, or
  ``gpu`` with the device name and compute capability), the CPU model, the core count, the BLAS/OpenMP thread
  setting, the variables that pin OpenBLAS's kernels (``OPENBLAS_CORETYPE``: Haswell's kernels on an AVX-512
  CPU halve SGEMM's rate, and so change which engine wins), the GEMM precision where it is not fp32 (bf16 runs
  other kernels: kernels/bf16_gemm.py), and the numpy, BLAS and cupy/CUDA versions.
- The layer key names the convolution: layer type, input and output shapes, weight shape, kernel, stride, pad,
  dilation, groups, dtype, the engine set AUTO chose among (a new engine in the set times them all again), and the
  revision of AUTO's rule of choice (:data:`CHOICE_RULE`: choices made by an earlier rule are timed again).

A cache that cannot be read (corrupt JSON, wrong layout, no permission) is ignored with one warning line naming
the file, and is replaced by the next store; an unwritable cache directory costs only the timing next time.
``$LAYERFORGE_CACHE_DIR`` set to ``off`` turns the cache off.

Other choices timed once per machine keep their own file beside it through :class:`ChoiceCache` (the training
configuration of a CPU, layerforge/dataparallel/cpu_parallel.py).
"""
import functools
import json
import logging
import os
import platform

import numpy

from ..errors import LayerforgeError
from ..npz import write_atomic
from .blas import gemm_precision
from .file_lock import locked_file

logger = logging.getLogger("layerforge")

CACHE_DIR_ENV = "LAYERFORGE_CACHE_DIR"
FILE_NAME = "conv_engines.json"
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
BLAS_KERNEL_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")  # a pinned kernel architecture or cache size
_warned = set()  # cache files already warned about: one line per bad file, not one per layer


def cache_dir():
    """The layerforge cache directory (see the module docstring); None when the cache is turned off."""
    given = os.environ.get(CACHE_DIR_ENV)
    if given:
        return None if given.lower() == "off" else given
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "layerforge")


class ChoiceCache:
    """One JSON file of the cache directory: ``{machine key: {key: {name: string}}}``, read and merged on every
    store, written atomically; an unreadable file is ignored with one warning naming it and ``what`` it holds."""

    def __init__(self, file_name, what):
        self.file_name, self.what = file_name, what

    def path(self):
        """The cache file, or None when the cache is off."""
        d = cache_dir()
        return None if d is None else os.path.join(d, self.file_name)

    def _read(self, path):
        """The whole table, ``{}`` when the file is missing or unreadable (warned once)."""
        try:
            with open(path) as f:
                table = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, UnicodeDecodeError) as e:  # json's errors are ValueErrors
            self._warn_once(path, f"unreadable: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
            return {}
        if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
            self._warn_once(path, "not a mapping of machines to choices")
            return {}
        return table

    def _warn_once(self, path, reason):
        if path not in _warned:
            _warned.add(path)
            logger.warning("%s: %s ignored (%s)", path, self.what, reason)

    def lookup(self, machine, key):
        """``{name: string}`` stored for this machine and key, or None."""
        path = self.path()
        if path is None:
            return None
        choice = self._read(path).get(machine, {}).get(key)
        if not isinstance(choice, dict) or not all(isinstance(v, str) for v in choice.values()):
            return None
        return choice

    def store(self, machine, key, choice):
        """Add one settled choice: read, merge, atomic rename, under an exclusive lock of ``FILE.lock``, so that
        processes storing at once (the replicas of a split batch time the same layers) lose none of each other's
        entries; without the lock (a folder that takes no file) the newest entry of one may be lost."""
        path = self.path()
        if path is None:
            return
        with locked_file(path + ".lock", LOCK_WAIT) as locked:
            if not locked:  # a process stopped while it held the lock (SIGSTOP, a debugger) must not stop this one
                self._warn_once(path, f"locked by another process for over {LOCK_WAIT:g} s; this choice is not kept")
                return
            table = self._read(path)
            if table.get(machine, {}).get(key) == choice:
                return
            table.setdefault(machine, {})[key] = dict(choice)
            text = json.dumps(table, indent=1, sort_keys=True).encode()
            try:
                write_atomic(path, lambda f: f.write(text))
            except LayerforgeError as e:  # a cache that cannot be written costs only the timing next time
                self._warn_once(path, f"not writable: {str(e)[len(path) + 2:][:100]}")


LOCK_WAIT = 2.0  # seconds a store waits for the cache's lock before it gives up keeping its choice


ENGINES = ChoiceCache(FILE_NAME, "engine cache")


def cache_path():
    """The engine-choice cache file, or None when the cache is off."""
    return ENGINES.path()


@functools.lru_cache(maxsize=None)
def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key(xp):
    """What the timing depended on, as one string (see the module docstring)."""
    try:
        blas = numpy.__config__.CONFIG["Build Dependencies"]["blas"]
        blas = f"{blas['name']}-{blas['version']}"
    except (AttributeError, KeyError, TypeError):
        blas = "unknown-blas"
    threads = ",".join(f"{v}={os.environ[v]}" for v in THREAD_VARS if v in os.environ) or "threads=default"
    pinned = [f"{v}={os.environ[v]}" for v in BLAS_KERNEL_VARS if os.environ.get(v)]  # absent where not pinned
    precision = [] if gemm_precision() == "fp32" else [f"gemm_precision={gemm_precision()}"]  # other kernels
    parts = [_cpu_model(), f"cores={os.cpu_count()}", threads] + pinned + precision + [f"numpy-{numpy.__version__}",
                                                                                        blas]
    return "|".join((_gpu(xp.cuda.Device().id) if xp is not numpy else ("cpu",)) + tuple(parts))


@functools.lru_cache(maxsize=None)
def _gpu(device_id):
    import cupy
    from ..backend import gpu_name
    return ("gpu", gpu_name(device_id), f"sm_{cupy.cuda.Device(device_id).compute_capability}", f"cupy-{cupy.__version__}",
            f"cuda-{cupy.cuda.runtime.runtimeGetVersion()}")


# the revision of AUTO's rule of choice (kernels/autotune.py) in the layer key: 2, the two directions choose together
# where a forward keeps its tiles for its backward (ConvEngines._forward_for_its_backward); 1 (none in the key),
# each direction its fastest alone
CHOICE_RULE = 2


def layer_key(layer_type, x_shape, y_shape, w_shape, geometry, group, dtype, engines):
    """The convolution a choice was timed for, as one string."""
    return (f"{layer_type}|x={'x'.join(map(str, x_shape))}|y={'x'.join(map(str, y_shape))}"
            f"|w={'x'.join(map(str, w_shape))}|geometry={','.join(map(str, geometry))}|group={group}"
            f"|{dtype}|engines={','.join(engines)}|rule={CHOICE_RULE}")


def lookup(machine, layer):
    """``{"forward": engine, "backward": engine}`` stored for this machine and layer, or None."""
    return ENGINES.lookup(machine, layer)


def store(machine, layer, choice):
    """Add one layer's settled choice to the engine cache."""
    ENGINES.store(machine, layer, choice)
