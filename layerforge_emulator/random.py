"""``cupy.random`` on the emulated device: seeded, repeatable streams of numbers.

``RandomState(seed)`` validates the seed as cupy's does (an integer from 0 to 2**64 - 1, or a numpy array
hashed as cupy hashes it) and draws from numpy's Philox generator keyed by the seed, so one seed gives one
sequence, run after run and on every emulated device. The numbers differ from real cuRAND's (XORWOW by
default): a test may rely on repeatability, never on particular values. Draws are made on the host when
asked for and copied to the device on the current stream; like cupy's, a float draw of an odd number of
elements fills one element more and returns a view of the first ones.
"""
import binascii
import hashlib
import os

import numpy

from .arrays import store
from .runtime import getDevice

FLOAT_TYPES = (numpy.dtype(numpy.float32), numpy.dtype(numpy.float64))


def _float_dtype(dtype):
    dtype = numpy.dtype(dtype)
    if dtype not in FLOAT_TYPES:
        raise TypeError("cupy.random only supports float32 and float64")
    return dtype


def _size(size):
    if size is None:
        return ()
    return tuple(size) if isinstance(size, (tuple, list)) else (int(size),)


class RandomState:
    """cupy's ``RandomState(seed=None, method=None)``: ``seed``, ``standard_normal``, ``normal``, ``uniform``,
    ``random_sample``, ``rand``, ``randn``, ``randint``."""

    def __init__(self, seed=None, method=None):
        self.method = method
        self.seed(seed)

    def seed(self, seed=None):
        if seed is None:
            seed = int(binascii.hexlify(os.urandom(8)), 16)
        elif isinstance(seed, numpy.ndarray):
            seed = int(hashlib.md5(seed, usedforsecurity=False).hexdigest()[:16], 16)
        else:
            seed_arr = numpy.asarray(seed)
            if seed_arr.dtype.kind not in "biu":
                raise TypeError("Seed must be an integer.")
            seed = int(seed_arr)
            if seed < 0 or seed >= 2 ** 64:
                raise ValueError("Seed must be an integer between 0 and 2**64 - 1")
        self._generator = numpy.random.Generator(numpy.random.Philox(seed))

    def _floats(self, draw, size, dtype):
        shape, dtype = _size(size), _float_dtype(dtype)
        count = int(numpy.prod(shape, dtype=numpy.int64))
        values = draw(count + count % 2, dtype)
        out = store(values)
        return out[:count].reshape(shape) if count % 2 else out.reshape(shape)

    def standard_normal(self, size=None, dtype=float):
        return self._floats(lambda n, dt: self._generator.standard_normal(n, dtype=dt), size, dtype)

    def normal(self, loc=0.0, scale=1.0, size=None, dtype=float):
        def draw(n, dt):
            return (self._generator.standard_normal(n, dtype=dt) * dt.type(scale) + dt.type(loc)).astype(dt)
        return self._floats(draw, size, dtype)

    def random_sample(self, size=None, dtype=float):
        return self._floats(lambda n, dt: self._generator.random(n, dtype=dt), size, dtype)

    def uniform(self, low=0.0, high=1.0, size=None, dtype=float):
        def draw(n, dt):
            return (dt.type(low) + self._generator.random(n, dtype=dt) * dt.type(high - low)).astype(dt)
        return self._floats(draw, size, dtype)

    def rand(self, *size, dtype=float):
        return self.random_sample(size, dtype)

    def randn(self, *size, dtype=float):
        return self.standard_normal(size, dtype)

    def randint(self, low, high=None, size=None, dtype="l"):
        low, high = (0, low) if high is None else (low, high)
        return store(self._generator.integers(low, high, _size(size), dtype=dtype))


_states = {}


def get_random_state():
    """The current device's global RandomState (cupy keeps one per device)."""
    device_id = getDevice()
    if device_id not in _states:
        seed = os.environ.get("CUPY_SEED")
        _states[device_id] = RandomState(None if seed is None else numpy.uint64(int(seed)))
    return _states[device_id]


def seed(seed=None):
    get_random_state().seed(seed)


def standard_normal(size=None, dtype=float):
    return get_random_state().standard_normal(size, dtype)


def normal(loc=0.0, scale=1.0, size=None, dtype=float):
    return get_random_state().normal(loc, scale, size, dtype)


def uniform(low=0.0, high=1.0, size=None, dtype=float):
    return get_random_state().uniform(low, high, size, dtype)


def random_sample(size=None, dtype=float):
    return get_random_state().random_sample(size, dtype)


random = random_sample


def rand(*size, dtype=float):
    return get_random_state().rand(*size, dtype=dtype)


def randn(*size, dtype=float):
    return get_random_state().randn(*size, dtype=dtype)


def randint(low, high=None, size=None, dtype="l"):
    return get_random_state().randint(low, high, size, dtype)
