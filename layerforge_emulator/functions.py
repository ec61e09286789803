"""The functions of the emulated ``cupy`` namespace (and the ndarray methods that are the same functions).

Each wraps the numpy function of the same name, run as a device operation (arrays.run): numpy's results,
cupy's rules on operands. Operands are device arrays or Python / numpy scalars; a numpy array raises
``TypeError: Unsupported type <class 'numpy.ndarray'>``. A function whose result's shape depends on the
values (``nonzero``, ``unique``, ``bincount``, one-argument ``where``, ``repeat`` by an array...)
synchronises the stream first, as cupy's does. Views (``reshape``, ``broadcast_to``, ``flip``...) share
memory. Only the part of cupy that layerforge uses, and its near neighbours, is here: anything else is an
AttributeError, never a silent numpy fallback.
"""
import builtins
import inspect

import numpy

from . import arrays, streams
from .arrays import SCALAR_TYPES, empty, ndarray, operand, run, run_in_place, run_into, run_synced, to_device

# the dtype names and constants of cupy's namespace are numpy's
DTYPE_NAMES = ("bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
               "float32", "float64", "complex64", "complex128", "intp", "uintp", "byte", "ubyte", "short",
               "ushort", "intc", "uintc", "longlong", "ulonglong", "half", "single", "double", "csingle",
               "cdouble", "integer", "floating", "number", "inexact", "signedinteger", "unsignedinteger",
               "complexfloating", "generic", "dtype", "finfo", "iinfo", "result_type", "can_cast",
               "promote_types", "min_scalar_type", "common_type", "issubdtype", "isscalar", "ndim", "newaxis",
               "pi", "e", "inf", "nan", "euler_gamma")
globals().update({name: getattr(numpy, name) for name in DTYPE_NAMES})
bool = numpy.bool_  # noqa: A001 - cupy.bool is numpy.bool
INTERNAL = {"builtins", "inspect", "NUMPY_ONLY", "CUPY_PARAMETERS", "ufunc", "numpy", "arrays", "streams", "SCALAR_TYPES", "operand", "run", "run_in_place", "run_into",
            "run_synced", "device_array", "DTYPE_NAMES", "UFUNCS", "REDUCTIONS", "INTERNAL", "to_device"}


# parameters of numpy's functions that cupy's functions of the same name do not take (tests/emulator/
# test_conformance.py compares every signature here with the real cupy's)
NUMPY_ONLY = {"initial", "where", "like", "device", "correction", "mean", "stable", "descending", "subok", "ndmin"}


# where cupy's parameters differ from numpy's of the same function: (dropped, renamed)
CUPY_PARAMETERS = {"argsort": ({"order"}, {}), "sort": ({"order"}, {}), "take": ({"mode"}, {}),
                   "count_nonzero": ({"keepdims"}, {}), "unique": ({"sorted"}, {}), "flip": ((), {"m": "a"}),
                   "fliplr": ((), {"m": "a"}), "flipud": ((), {"m": "a"}), "stack": ((), {"arrays": "tup"}),
                   "reshape": ((), {"shape": "newshape"})}


def _signature(np_fn):
    """numpy's signature of ``np_fn`` made cupy's: the arguments a wrapper accepts."""
    sig = inspect.signature(np_fn)
    drop, rename = CUPY_PARAMETERS.get(np_fn.__name__, ((), {}))
    params = []
    for p in sig.parameters.values():
        if p.name in NUMPY_ONLY or p.name in drop:
            continue
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD if p.name in rename and p.kind == p.POSITIONAL_ONLY else p.kind
        params.append(p.replace(name=rename.get(p.name, p.name), kind=kind))
    if np_fn.__name__ == "reshape":  # numpy 2 made `a` positional-only; cupy's is not
        params[0] = params[0].replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sig.replace(parameters=params)


def _checked(f, np_fn):
    """``f`` taking exactly what cupy's function of the name takes (TypeError otherwise, as a Python call)."""
    sig = _signature(np_fn)

    def wrapper(*args, **kwargs):
        sig.bind(*args, **kwargs)
        return f(*args, **kwargs)
    wrapper.__name__, wrapper.__signature__, wrapper.__doc__ = np_fn.__name__, sig, f.__doc__
    return wrapper


def device_array(x, what="array"):
    """``x`` if it is a device array; cupy's TypeError otherwise."""
    if not isinstance(x, ndarray):
        raise TypeError(f"Unsupported type {type(x)}")
    return x


def _arrays(seq):
    for x in seq:
        device_array(x)
    return seq


class ufunc:
    """cupy's ufunc over numpy's: ``f(*operands, out=None, dtype=None)``, ``at``, ``reduce``,
    ``accumulate``, ``outer``, ``reduceat``."""

    def __init__(self, np_ufunc):
        self._np = np_ufunc
        self.__name__ = self.name = np_ufunc.__name__
        self.nin, self.nout, self.nargs, self.types = np_ufunc.nin, np_ufunc.nout, np_ufunc.nargs, np_ufunc.types
        self.__doc__ = f"cupy.{self.name}: numpy.{self.name} on the emulated device."

    def __repr__(self):
        return f"<ufunc '{self.name}'>"

    def __call__(self, *args, out=None, dtype=None, casting="same_kind", **kwargs):
        if len(args) > self.nin:
            args, out = args[:self.nin], args[self.nin:] if len(args) > self.nin + 1 else args[self.nin]
        for a in args:
            operand(a)
        kw = dict(kwargs, casting=casting)
        if dtype is not None:
            kw["dtype"] = dtype
        if "where" in kw:
            operand(kw["where"])
        if out is None:
            return run(self._np, *args, name=self.name, **kw)
        if isinstance(out, tuple):
            _arrays(out)
            streams.submit(lambda o, a: arrays._call(self._np, a, [("out", tuple(o))] + list(kw.items())),
                           list(out), list(args), name=self.name)
            return out
        return run_into(self._np, out, *args, name=self.name, **kw)

    def at(self, a, indices, b=None):
        device_array(a)
        indices = arrays._index(indices)
        if b is None:
            run_in_place(self._np.at, a, indices, name=f"{self.name}.at")
        else:
            run_in_place(self._np.at, a, indices, operand(b), name=f"{self.name}.at")

    def reduce(self, array, axis=0, dtype=None, out=None, keepdims=False):
        return _maybe_into(self._np.reduce, out, device_array(array), axis=axis, dtype=dtype,
                           keepdims=keepdims)

    def accumulate(self, array, axis=0, dtype=None, out=None):
        return _maybe_into(self._np.accumulate, out, device_array(array), axis=axis, dtype=dtype)

    def reduceat(self, array, indices, axis=0, dtype=None, out=None):
        return _maybe_into(self._np.reduceat, out, device_array(array), arrays._device_index(indices), axis=axis,
                           dtype=dtype)

    def outer(self, A, B, **kwargs):
        return run(self._np.outer, operand(A), operand(B), **kwargs)


UFUNCS = ("abs absolute acos acosh add arccos arccosh arcsin arcsinh arctan arctan2 arctanh asin asinh atan "
          "atan2 atanh bitwise_and bitwise_count bitwise_invert bitwise_left_shift bitwise_not bitwise_or "
          "bitwise_right_shift bitwise_xor cbrt ceil conj conjugate copysign cos cosh deg2rad degrees divide "
          "divmod equal exp exp2 expm1 fabs float_power floor floor_divide fmax fmin fmod frexp gcd greater "
          "greater_equal heaviside hypot invert isfinite isinf isnan lcm ldexp left_shift less less_equal log "
          "log10 log1p log2 logaddexp logaddexp2 logical_and logical_not logical_or logical_xor maximum minimum "
          "mod modf multiply negative nextafter not_equal positive pow power rad2deg radians reciprocal "
          "remainder right_shift rint sign signbit sin sinh sqrt square subtract tan tanh true_divide "
          "trunc").split()
globals().update({name: ufunc(getattr(numpy, name)) for name in UFUNCS})


def _maybe_into(fn, out, *args, **kwargs):
    kwargs = {k: v for k, v in kwargs.items() if v is not None or k in ("axis",)}
    if out is None:
        return run(fn, *args, **kwargs)
    return run_into(fn, out, *args, **kwargs)


# ---- creation ----------------------------------------------------------------------------------------

def _filled(shape, dtype, order, value):
    out = empty(shape, dtype, order)
    run_in_place(arrays.assign, out, value, name="fill")
    return out


def zeros(shape, dtype=float, order="C"):
    return _filled(shape, dtype, order, 0)


def ones(shape, dtype=float, order="C"):
    return _filled(shape, dtype, order, 1)


def full(shape, fill_value, dtype=None, order="C"):
    if isinstance(fill_value, ndarray):
        out = empty(shape, fill_value.dtype if dtype is None else dtype, order)
        run_in_place(arrays.assign, out, fill_value, name="fill")
        return out
    operand(fill_value)
    return _filled(shape, numpy.array(fill_value).dtype if dtype is None else dtype, order, fill_value)


def _like(a, dtype, order, shape):
    dtype = a.dtype if dtype is None else dtype
    shape = a.shape if shape is None else shape
    if order in ("K", "A"):
        order = "F" if a.flags.f_contiguous and not a.flags.c_contiguous else "C"
    return shape, dtype, order


def empty_like(prototype, dtype=None, order="K", subok=None, shape=None):
    return empty(*_like(prototype, dtype, order, shape))


def zeros_like(a, dtype=None, order="K", subok=None, shape=None):
    return zeros(*_like(a, dtype, order, shape))


def ones_like(a, dtype=None, order="K", subok=None, shape=None):
    return ones(*_like(a, dtype, order, shape))


def full_like(a, fill_value, dtype=None, order="K", subok=None, shape=None):
    shape, dtype, order = _like(a, dtype, order, shape)
    return full(shape, fill_value, dtype, order)


def arange(start, stop=None, step=1, dtype=None):
    return to_device(numpy.arange(start, stop, step, dtype) if stop is not None else numpy.arange(start, dtype=dtype))


def linspace(start, stop, num=50, endpoint=True, retstep=False, dtype=None, axis=0):
    values = numpy.linspace(start, stop, num, endpoint, retstep, dtype, axis)
    return (to_device(values[0]), values[1]) if retstep else to_device(values)


def eye(N, M=None, k=0, dtype=float, order="C"):
    return to_device(numpy.eye(N, M, k, dtype, order))


def identity(n, dtype=float):
    return eye(n, dtype=dtype)


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0, *, blocking=False):
    """``cupy.array``: a device array from a device array (a copy unless ``copy`` is False and nothing
    changes) or from host data (a host-to-device copy)."""
    if isinstance(obj, ndarray):
        a = obj if dtype is None or numpy.dtype(dtype) == obj.dtype else obj.astype(dtype)
        if copy and a is obj:
            a = obj.copy("F" if order == "F" else "C")
        while a.ndim < ndmin:
            a = a[None]
        return a
    if isinstance(obj, (list, tuple)) and builtins.any(isinstance(x, ndarray) for x in obj):
        return stack([array(x, dtype) for x in obj])
    host = numpy.array(obj, dtype=dtype, ndmin=ndmin)
    return to_device(host, order=order)


def asarray(a, dtype=None, order=None, *, blocking=False):
    return array(a, dtype, copy=False, order=order or "K", blocking=blocking)


def asanyarray(a, dtype=None, order=None):
    return asarray(a, dtype, order)


def ascontiguousarray(a, dtype=None):
    a = asarray(a, dtype)
    return a if a.flags.c_contiguous else a.copy("C")


def asfortranarray(a, dtype=None):
    a = asarray(a, dtype)
    return a if a.flags.f_contiguous else a.copy("F")


def copy(a, order="K"):
    return device_array(a).copy("F" if order == "F" else "C")


def copyto(dst, src, casting="same_kind", where=None):
    device_array(dst)
    operand(src)
    if where is None:
        run_in_place(lambda d, s: numpy.copyto(d, s, casting=casting), dst, src, name="copyto")
    else:
        run_in_place(lambda d, s, w: numpy.copyto(d, s, casting=casting, where=w), dst, src, operand(where),
                     name="copyto")


def asnumpy(a, stream=None, order="C", out=None, *, blocking=True):
    """``cupy.asnumpy``: a device array's host copy (``get``), anything else through ``numpy.asarray``."""
    if isinstance(a, ndarray):
        return a.get(stream=stream, order=order, out=out, blocking=blocking)
    host = numpy.asarray(a, order=order)
    if out is not None:
        out[...] = host
        return out
    return host


# ---- shapes and views ----------------------------------------------------------------------------------

def _view(np_fn):
    def f(a, *args, **kwargs):
        return device_array(a)._view_or_copy(np_fn, *args, **kwargs)
    f.__doc__ = f"cupy.{np_fn.__name__}: a view of the array where numpy gives one."
    return _checked(f, np_fn)


for _name in ("reshape", "ravel", "transpose", "swapaxes", "moveaxis", "rollaxis", "expand_dims", "squeeze",
              "broadcast_to", "flip", "fliplr", "flipud", "diagonal", "atleast_1d", "atleast_2d", "atleast_3d"):
    globals()[_name] = _view(getattr(numpy, _name))


def broadcast_arrays(*args):
    shape = numpy.broadcast_shapes(*(device_array(a).shape for a in args))
    return [broadcast_to(a, shape) for a in args]


def _views(np_fn):
    def f(a, *args, **kwargs):
        a = device_array(a)
        return [a._wrap_view(v) for v in np_fn(a._host, *args, **kwargs)]
    return _checked(f, np_fn)


split, array_split, hsplit, vsplit = (_views(getattr(numpy, n)) for n in ("split", "array_split", "hsplit", "vsplit"))


def may_share_memory(a, b, max_work=None):
    """Whether the device memory extents of two arrays overlap (cupy's test)."""
    if not (isinstance(a, ndarray) and isinstance(b, ndarray)) or a.data.device_id != b.data.device_id:
        return False
    if a.size == 0 or b.size == 0:
        return False
    return _extent(a)[0] < _extent(b)[1] and _extent(b)[0] < _extent(a)[1]


def _extent(a):
    low = a.data.ptr + builtins.sum(s * (n - 1) for n, s in zip(a.shape, a.strides) if s < 0)
    high = a.data.ptr + builtins.sum(s * (n - 1) for n, s in zip(a.shape, a.strides) if s > 0) + a.itemsize
    return low, high


def shares_memory(a, b, max_work=None):
    if not may_share_memory(a, b):
        return False
    return numpy.shares_memory(a._host, b._host)


def shape(a):
    return device_array(a).shape


def size(a, axis=None):
    return device_array(a).size if axis is None else a.shape[axis]


# ---- computations ------------------------------------------------------------------------------------

def _compute(np_fn, operands=1, name=None):
    """A numpy function whose first ``operands`` positional arguments are device arrays (or scalars where
    numpy's function takes them), run as one device operation; ``out=`` writes a device array."""
    def f(*args, out=None, **kwargs):
        if operands == 1:  # a function of one array: the array must be on the device
            device_array(args[0])
        for a in args[:operands]:
            operand(a)
        if out is None:
            return run(np_fn, *args, name=f.__name__, **kwargs)
        return run_into(np_fn, out, *args, name=f.__name__, **kwargs)
    f.__name__ = name or np_fn.__name__
    f.__doc__ = f"cupy.{f.__name__}: numpy.{np_fn.__name__} as a device operation."
    return _checked(f, np_fn)


REDUCTIONS = ("sum", "prod", "mean", "var", "std", "max", "min", "amax", "amin", "any", "all", "nansum", "nanprod",
              "nanmean", "nanvar", "nanstd", "nanmax", "nanmin", "cumsum", "cumprod", "ptp", "median", "nanmedian",
              "average", "count_nonzero", "trace", "sort", "argsort", "around", "round", "searchsorted", "diff",
              "roll", "tile", "pad", "fix", "nan_to_num", "real", "imag", "tril", "triu", "cross", "kron", "vdot",
              "inner", "outer", "tensordot", "dot", "matmul", "isclose", "allclose", "array_equal", "interp",
              "convolve", "correlate", "angle", "i0", "sinc")
for _name in REDUCTIONS:
    _np_fn = getattr(numpy, _name)
    globals()[_name] = _compute(_np_fn, operands=2 if _name in (
        "cross", "kron", "vdot", "inner", "outer", "tensordot", "dot", "matmul", "isclose", "allclose",
        "array_equal", "searchsorted", "convolve", "correlate") else 1)


def _arg_reduction(np_fn):
    def f(a, axis=None, dtype=None, out=None, keepdims=False):
        """cupy's argmax / argmin: the index (of ``dtype``, default int64) of the extreme along ``axis``."""
        device_array(a)
        if out is not None:
            return run_into(np_fn, out, a, axis, keepdims=keepdims)
        index = run(np_fn, a, axis, keepdims=keepdims, name=np_fn.__name__)
        return index if dtype is None else index.astype(dtype)
    f.__name__ = np_fn.__name__
    return f


argmax, argmin = _arg_reduction(numpy.argmax), _arg_reduction(numpy.argmin)


def clip(a, a_min, a_max, out=None):
    device_array(a)
    if out is None:
        return run(numpy.clip, a, a_min, a_max, name="clip")
    return run_into(numpy.clip, out, a, a_min, a_max, name="clip")


def take_along_axis(a, indices, axis):
    return run(numpy.take_along_axis, device_array(a), device_array(indices), axis, name="take_along_axis")


def take(a, indices, axis=None, out=None):
    device_array(a)
    indices = arrays._device_index(indices)
    if out is None:
        return run(numpy.take, a, indices, axis, name="take")
    return run_into(numpy.take, out, a, indices, axis, name="take")


def concatenate(tup, axis=0, out=None, *, dtype=None, casting="same_kind"):
    tup = list(tup)
    for a in tup:
        if not isinstance(a, ndarray):
            raise TypeError("Only cupy arrays can be concatenated")
    kwargs = {"axis": axis, "casting": casting, **({"dtype": dtype} if dtype is not None else {})}
    if out is None:
        return run(numpy.concatenate, tup, name="concatenate", **kwargs)
    return run_into(numpy.concatenate, out, tup, name="concatenate", **kwargs)


def _sequence(np_fn):
    def f(tup, *args, **kwargs):
        return run(np_fn, _arrays(list(tup)), *args, name=np_fn.__name__, **kwargs)
    return _checked(f, np_fn)


stack, vstack, hstack, dstack, column_stack = (_sequence(getattr(numpy, n)) for n in
                                               ("stack", "vstack", "hstack", "dstack", "column_stack"))


def where(condition, x=None, y=None):
    """Three arguments: element-wise choice. One: the indices of the true elements (synchronises)."""
    if x is None and y is None:
        return nonzero(condition)
    if x is None or y is None:
        raise ValueError("Must provide both 'x' and 'y' or neither.")
    return run(numpy.where, operand(condition), operand(x), operand(y), name="where")


def _synced(np_fn, name=None):
    def f(a, *args, **kwargs):
        device_array(a)
        return run_synced(np_fn, a, *args, name=f.__name__, **kwargs)
    f.__name__ = name or np_fn.__name__
    f.__doc__ = f"cupy.{f.__name__}: the result's shape depends on the values, so the stream synchronises."
    return _checked(f, np_fn)


for _name in ("nonzero", "flatnonzero", "argwhere", "unique"):
    globals()[_name] = _synced(getattr(numpy, _name))


def bincount(x, weights=None, minlength=None):
    """cupy's bincount reads the largest value on the host first: it synchronises."""
    device_array(x)
    if weights is not None:
        device_array(weights)
    return run_synced(numpy.bincount, x, weights, minlength=minlength or 0, name="bincount")


def repeat(a, repeats, axis=None):
    device_array(a)
    if isinstance(repeats, ndarray):
        return run_synced(numpy.repeat, a, repeats, axis, name="repeat")
    return run(numpy.repeat, a, repeats, axis, name="repeat")


def einsum(subscripts, *operands, **kwargs):
    return run(numpy.einsum, subscripts, *_arrays(operands), name="einsum", **kwargs)


def put_along_axis(arr, indices, values, axis):
    run_in_place(numpy.put_along_axis, device_array(arr), device_array(indices), operand(values), axis)


# ndarray methods that are these functions of the array
arrays._METHODS.update({name: globals()[name] for name in (
    "sum", "prod", "mean", "var", "std", "max", "min", "argmax", "argmin", "any", "all", "cumsum", "cumprod",
    "ptp", "trace", "argsort", "clip", "round", "searchsorted", "dot", "nonzero", "take",
    "repeat", "conj", "conjugate")})
arrays._METHODS["compress"] = lambda a, condition, axis=None, out=None: run_synced(numpy.compress, condition, a,
                                                                                   axis, name="compress")
arrays._METHODS["choose"] = lambda a, choices, out=None, mode="raise": run(numpy.choose, a, _arrays(list(choices)))
arrays._METHODS["scatter_add"] = lambda a, slices, value: globals()["add"].at(a, slices, value)


# ---- ndarray's operators and numpy protocols: these functions of the array ----------------------------------

def _binary(name, reflected=False):
    def method(self, other):
        if isinstance(other, (ndarray, numpy.ndarray)) or isinstance(other, SCALAR_TYPES):
            fn = globals()[name]
            return fn(other, self) if reflected else fn(self, other)
        return NotImplemented
    return method


def _in_place(name):
    def method(self, other):
        globals()[name](self, other, out=self)
        return self
    return method


def _unary(name):
    return lambda self: globals()[name](self)


for _op, _fn in [("add", "add"), ("sub", "subtract"), ("mul", "multiply"), ("truediv", "true_divide"),
                 ("floordiv", "floor_divide"), ("mod", "remainder"), ("pow", "power"), ("and", "bitwise_and"),
                 ("or", "bitwise_or"), ("xor", "bitwise_xor"), ("lshift", "left_shift"),
                 ("rshift", "right_shift"), ("matmul", "matmul"), ("divmod", "divmod")]:
    setattr(ndarray, f"__{_op}__", _binary(_fn))
    setattr(ndarray, f"__r{_op}__", _binary(_fn, reflected=True))
    if _op not in ("divmod", "matmul"):
        setattr(ndarray, f"__i{_op}__", _in_place(_fn))
for _op, _fn in [("eq", "equal"), ("ne", "not_equal"), ("lt", "less"), ("le", "less_equal"), ("gt", "greater"),
                 ("ge", "greater_equal")]:
    setattr(ndarray, f"__{_op}__", _binary(_fn))
for _op, _fn in [("neg", "negative"), ("pos", "positive"), ("abs", "absolute"), ("invert", "invert")]:
    setattr(ndarray, f"__{_op}__", _unary(_fn))


def _array_ufunc(self, np_ufunc, method, *inputs, **kwargs):
    """numpy ufuncs on device arrays run the emulated cupy's ufunc of the same name (cupy's dispatch)."""
    target = globals().get(np_ufunc.__name__)
    if not isinstance(target, ufunc):
        return NotImplemented
    if "out" in kwargs:
        out = kwargs["out"]
        if len(out) != 1:
            raise ValueError("The 'out' parameter must have exactly one array value")
        kwargs["out"] = out[0]
    return (target if method == "__call__" else getattr(target, method))(*inputs, **kwargs)


def _array_function(self, func, types, args, kwargs):
    """numpy functions on device arrays run the emulated cupy's function of the same name."""
    target = globals().get(func.__name__)
    if (target is None or target is func or func.__name__ in INTERNAL
            or not builtins.all(issubclass(t, (ndarray, numpy.ndarray)) for t in types)):
        return NotImplemented
    return target(*args, **kwargs)


ndarray.__array_ufunc__, ndarray.__array_function__ = _array_ufunc, _array_function
