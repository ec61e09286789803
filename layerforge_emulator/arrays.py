"""The emulated ``cupy.ndarray``: device memory with numpy's semantics and cupy's strictness.

An array is a shape, strides and dtype over device memory (memory.py); it is not a numpy array and does not
subclass one. Its numpy view of that memory (``_host``) is the emulator's own business: every operation
reaches it through streams.submit, so it runs when its stream runs it (streams.py).

What it reproduces of cupy:

- ``__array__`` raises cupy's TypeError, so ``numpy.asarray(a)`` fails; ``.get()``, ``cupy.asnumpy`` (and
  ``tolist``, ``item``, ``float()``, ``int()``, ``bool()``, ``repr``, which call ``get``) are the only ways
  back to the host, and each synchronises the stream first. A host array as an operand of an operation
  raises cupy's ``TypeError: Unsupported type <class 'numpy.ndarray'>`` (Python and numpy scalars are
  operands; lists and numpy arrays are accepted as indices, as cupy converts them);
  ``a[...] = host_array`` raises cupy's ValueError from ``fill``.
- numpy functions on cupy arrays dispatch to the emulated cupy (``__array_ufunc__``,
  ``__array_function__``), as cupy's do.
- Views share memory (basic indexing, reshape, transpose, ``T``, ``view``...); ``data.ptr``, ``strides``,
  ``flags``, ``device``, ``nbytes`` are those of the device memory.
- Results whose shape depends on the values (boolean-mask indexing, ``nonzero``, ``unique``,
  ``bincount`` without ``minlength``...) synchronise the stream, as cupy's do.
- Operations use numpy's type promotion (NEP 50, as cupy 14), never warn (cupy's kernels do not), and
  return C-contiguous results. An operand on another device raises cupy's ValueError (the emulated
  devices have no peer access).

Stricter than cupy: integer-array indices out of bounds raise IndexError (cupy wraps them around).
"""
import operator

import numpy

from . import memory, streams
from .device import Device
from .graphs import capture_of

SCALAR_TYPES = (bool, int, float, complex, numpy.generic)


def assign(out, value):
    """``out[...] = value`` (numpy's casting of an assignment, as cupy's fill and copies)."""
    out[...] = value


def refuse_transfer(direction, stream=None):
    """cupy's check before a copy between host and device: refused while the stream (the current one) captures."""
    if capture_of(streams.get_current_stream() if stream is None else stream) is not None:
        raise RuntimeError(f"the current stream is capturing, so {direction} transfers are disallowed")


def operand(x):
    """``x`` if it may be an operand of a cupy operation (a device array, a Python or numpy scalar)."""
    if isinstance(x, ndarray) or isinstance(x, SCALAR_TYPES):
        return x
    raise TypeError(f"Unsupported type {type(x)}")


def _probe(x):
    """A device array as a memory-free numpy stand-in of its shape and dtype (to learn a result's shape)."""
    if isinstance(x, ndarray):
        return numpy.broadcast_to(numpy.zeros((), x.dtype), x.shape)
    if type(x) in (tuple, list):
        return type(x)(_probe(v) for v in x)
    return x


def _call(fn, args, kwargs):
    with numpy.errstate(all="ignore"):
        return fn(*args, **dict(kwargs))


def _results(value):
    """A numpy result as a flat list of arrays (a scalar as a 0-d array)."""
    if isinstance(value, (tuple, list)):
        return [numpy.asarray(v) for v in value]
    return [numpy.asarray(value)]


def _shaped(outs, value):
    return tuple(outs) if isinstance(value, (tuple, list)) else outs[0]


def _store_into(outs, value):
    for out, v in zip(outs, _results(value)):
        out[...] = v


def store(value):
    """A host result (numpy array, scalar or tuple of them) copied into new device arrays on the current
    stream (the copy is the stream's: from a private host buffer, so it may run later)."""
    outs = [empty(v.shape, v.dtype) for v in _results(value)]
    streams.submit(_store_into, outs, value, name="copy to device")
    return _shaped(outs, value)


def run(fn, *args, name=None, **kwargs):
    """``fn(*args, **kwargs)`` (a numpy function) as a device operation on the current stream; the result
    in new device arrays. The operation runs later (when its stream's work is waited for), so the result's shape
    and dtype come from calling ``fn`` on memory-free stand-ins of the arrays first (remembered per function and
    argument kinds)."""
    name = name or getattr(fn, "__name__", "operation")
    kw = list(kwargs.items())
    value = _result_kinds(fn, list(args), kw)
    outs = [empty(shape, dtype) for shape, dtype in value]
    streams.submit(lambda o, a, k: _store_into(o, _call(fn, a, k)), outs, list(args), kw, name=name)
    return tuple(outs) if value.is_tuple else outs[0]


class _Kinds(list):
    """The (shape, dtype) of each result of a call, and whether the call returns a tuple of them."""

    is_tuple = False


_KINDS = {}  # the results' kinds of calls seen before, by function and the arguments' kinds


def _kind_key(x):
    """What of an argument can decide a result's shape and dtype (None when it cannot be told)."""
    if isinstance(x, ndarray):
        return ("a", x.shape, x.dtype.str)
    if type(x) in (tuple, list):
        keys = tuple(_kind_key(v) for v in x)
        return None if None in keys else (type(x).__name__,) + keys
    if x is None or type(x) in (bool, int, float, complex, str, slice, type(Ellipsis)):
        return (type(x).__name__, repr(x))
    if isinstance(x, numpy.generic):
        return ("g", x.dtype.str, repr(x))
    if isinstance(x, (numpy.dtype, type)):
        return ("t", str(x))
    return None


def _result_kinds(fn, args, kw):
    """The kinds of ``fn(*args, **kw)``'s results, from a call on memory-free stand-ins of the device arrays
    (remembered: the stand-ins cost a full computation)."""
    key = _kind_key([args, kw])
    try:
        key = None if key is None else (fn, key)
        kinds = _KINDS.get(key) if key is not None else None
    except TypeError:  # an unhashable function
        key = kinds = None
    if kinds is None:
        value = _call(fn, _probe(args), [(k, _probe(v)) for k, v in kw])
        kinds = _Kinds((v.shape, v.dtype) for v in _results(value))
        kinds.is_tuple = isinstance(value, (tuple, list))
        if key is not None:
            if len(_KINDS) > 4096:  # functions made per call (lambdas) would only grow it
                _KINDS.clear()
            _KINDS[key] = kinds
    return kinds


def run_into(fn, out, *args, name=None, **kwargs):
    """``fn(*args, out=out, **kwargs)`` as a device operation writing the device array ``out``; returns out."""
    if not isinstance(out, ndarray):
        raise TypeError("Output arguments must be cupy.ndarray")
    streams.submit(lambda o, a, k: _call(fn, a, [("out", o)] + k), out, list(args), list(kwargs.items()),
                   name=name or getattr(fn, "__name__", "operation"))
    return out


def run_in_place(fn, *args, name=None):
    """``fn(*args)`` for its effect on device arrays among ``args`` (setitem, sort, ufunc.at...)."""
    streams.submit(lambda *a: _call(fn, a, ()), *args, name=name or getattr(fn, "__name__", "operation"))


def run_synced(fn, *args, name=None, **kwargs):
    """A result whose shape depends on the values: the stream's work is done first (a device-to-host copy in
    cupy, so refused under capture), then ``fn`` runs on the host views and its result goes to the device."""
    refuse_transfer("D2H")
    streams.host_sync()
    host = streams.host_views(list(args))
    kw = [(k, v) for k, v in zip(kwargs, streams.host_views(list(kwargs.values())))]
    return store(_call(fn, host, kw))


class _Flags:
    """``a.flags``: C_CONTIGUOUS, F_CONTIGUOUS, OWNDATA (attribute or item access), as cupy's flags."""

    def __init__(self, c, f, owndata):
        self.c_contiguous, self.f_contiguous, self.owndata = c, f, owndata

    def __getitem__(self, key):
        return {"C_CONTIGUOUS": self.c_contiguous, "F_CONTIGUOUS": self.f_contiguous,
                "OWNDATA": self.owndata}[key]

    def __repr__(self):
        return (f"  C_CONTIGUOUS : {self.c_contiguous}\n  F_CONTIGUOUS : {self.f_contiguous}\n"
                f"  OWNDATA : {self.owndata}")


def _view(memptr, host, base):
    """A device array over ``memptr`` whose numpy view of the memory is ``host``."""
    a = ndarray.__new__(ndarray)
    a.data, a._host, a.base = memptr, host, base
    return a


def _host_view(memptr, shape, dtype, strides):
    mem = memptr.mem
    if mem.alloc is None or 0 in shape:
        return numpy.ndarray(shape, dtype, strides=strides if 0 not in shape else None)
    return numpy.ndarray(shape, dtype, buffer=mem.alloc.buffer, offset=memptr.ptr - mem.ptr, strides=strides)


class ndarray(streams.DeviceData):
    """``cupy.ndarray(shape, dtype=float, memptr=None, strides=None, order='C')``: new device memory from the
    allocator in force, or a view of ``memptr``."""

    __slots__ = ("data", "_host", "base", "__weakref__")
    __array_priority__ = 100

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        shape = tuple(int(n) for n in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        dtype = numpy.dtype(dtype)
        if any(n < 0 for n in shape):
            raise ValueError("negative dimensions are not allowed")
        if strides is None:
            strides = _contiguous_strides(shape, dtype.itemsize, order)
        if memptr is None:
            nbytes = int(numpy.prod(shape, dtype=numpy.int64)) * dtype.itemsize
            memptr = memory.alloc(nbytes)
        self.data, self.base = memptr, None
        self._host = _host_view(memptr, shape, dtype, tuple(strides))

    # ---- what the array is -------------------------------------------------------------------------
    shape = property(lambda self: self._host.shape)
    strides = property(lambda self: self._host.strides)
    dtype = property(lambda self: self._host.dtype)
    ndim = property(lambda self: self._host.ndim)
    size = property(lambda self: self._host.size)
    itemsize = property(lambda self: self._host.itemsize)
    nbytes = property(lambda self: self._host.nbytes)
    device = property(lambda self: Device(self.data.device_id))

    @shape.setter
    def shape(self, value):
        v = self.reshape(value)
        if v.base is None and v is not self:
            raise AttributeError("Incompatible shape for in-place modification. Use `.reshape()` to make a "
                                 "copy with the desired shape.")
        self._host = v._host

    @property
    def flags(self):
        return _Flags(self._host.flags.c_contiguous, self._host.flags.f_contiguous, self.base is None)

    @property
    def __cuda_array_interface__(self):
        c = self._host.flags.c_contiguous
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.data.ptr, False), "version": 3,
                "strides": None if c else self.strides}

    def _ref(self):
        return streams.Ref(self.data.ptr, self.shape, self.strides, self.dtype, self.data.device_id)

    def _wrap_view(self, host):
        """``host`` (a numpy array) as a device view of this array's memory, or None when it is a copy."""
        mem = self.data.mem
        if host.size == 0:
            return _view(self.data, host, self.base if self.base is not None else self)
        alloc = mem.alloc
        if alloc is None or not alloc.ptr <= host.ctypes.data < alloc.ptr + alloc.size:
            return None
        return _view(memory.MemoryPointer(mem, host.ctypes.data - mem.ptr), host,
                     self.base if self.base is not None else self)

    def _view_or_copy(self, fn, *args, **kwargs):
        """``fn(self, ...)``: a view when numpy makes one, else the same as a device operation (a copy)."""
        v = self._wrap_view(fn(self._host, *args, **kwargs))
        return v if v is not None else run(fn, self, *args, **kwargs)

    # ---- crossings -----------------------------------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct "
                        "a NumPy array explicitly.")

    def get(self, stream=None, order="C", out=None, blocking=True):
        """A host copy (into ``out`` when given): the copy runs on ``stream`` (the current one), and the host
        waits for it unless ``blocking`` is False and ``out`` is page-locked."""
        return device_to_host(self, stream, order, out, blocking)

    def set(self, arr, stream=None):
        """Copy the host array ``arr`` into this array on ``stream`` (the current one)."""
        host_to_device(self, arr, stream)

    def item(self, *args):
        return self.get().item(*args)

    def tolist(self):
        return self.get().tolist()

    def tobytes(self, order="C"):
        return self.get().tobytes(order)

    def __float__(self):
        return float(self.get())

    def __int__(self):
        return int(self.get())

    def __complex__(self):
        return complex(self.get())

    def __bool__(self):
        return bool(self.get())

    def __repr__(self):
        return repr(self.get())

    def __str__(self):
        return str(self.get())

    def __format__(self, spec):
        return format(self.get(), spec)

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    def __reduce__(self):
        return to_device, (self.get(),)

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        with self.device:
            return self.copy()

    # the numpy protocols (__array_ufunc__, __array_function__) and the operators are attached by functions.py

    # ---- views ---------------------------------------------------------------------------------------
    def reshape(self, *shape, order="C"):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return self._view_or_copy(numpy.reshape, shape, order=order)

    def ravel(self, order="C"):
        return self._view_or_copy(numpy.ravel, order)

    def flatten(self, order="C"):
        return self.copy(order).ravel(order)

    def transpose(self, *axes):
        axes = axes[0] if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list))) else axes
        return self._wrap_view(self._host.transpose(*((axes,) if axes else ())))

    T = property(lambda self: self.transpose())
    mT = property(lambda self: self.swapaxes(-1, -2))

    def swapaxes(self, axis1, axis2):
        return self._wrap_view(self._host.swapaxes(axis1, axis2))

    def squeeze(self, axis=None):
        return self._wrap_view(self._host.squeeze(axis))

    def diagonal(self, offset=0, axis1=0, axis2=1):
        return self._wrap_view(self._host.diagonal(offset, axis1, axis2))

    def view(self, dtype=None):
        return self._wrap_view(self._host.view() if dtype is None else self._host.view(dtype))

    # ---- indexing ------------------------------------------------------------------------------------
    def __getitem__(self, key):
        key = _index(key)
        if _has_array(key):
            if _has_mask(key):
                return run_synced(operator.getitem, self, key, name="boolean index")
            return run(operator.getitem, self, key, name="gather")
        view = self._host[key]
        if not isinstance(view, numpy.ndarray):  # every axis indexed by an integer: cupy gives a 0-d view
            view = self._host[(key if isinstance(key, tuple) else (key,)) + (Ellipsis,)]
        return self._wrap_view(view)

    def __setitem__(self, key, value):
        key = _index(key)
        if _has_array(key) and isinstance(value, (numpy.ndarray, list)):
            # a scatter (integer-array or mask index) takes host values: cupy copies them to the device first
            # (_routines_indexing.pyx, _scatter_op_single and _scatter_op_mask_single: core.array(value));
            # only a plain view refuses them, filling from them (gh-2079)
            value = to_device(value, dtype=self.dtype)
        elif isinstance(value, numpy.ndarray) and value.ndim > 0:
            raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
        elif not isinstance(value, numpy.ndarray):
            operand(value)
        run_in_place(operator.setitem, self, key, value, name="setitem")

    def fill(self, value):
        if isinstance(value, numpy.ndarray):
            if value.shape != ():
                raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
            value = value.item()
        operand(value)
        run_in_place(assign, self, value, name="fill")

    def put(self, indices, values, mode="wrap"):
        run_in_place(numpy.put, self, _device_index(indices), values, mode)

    # ---- copies and conversions ----------------------------------------------------------------------
    def copy(self, order="C"):
        return run(numpy.array, self, copy=True, order=order, name="copy")

    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        dtype = numpy.dtype(dtype)
        if not copy and dtype == self.dtype:
            return self
        return run(lambda a: a.astype(dtype, order="C", casting=casting or "unsafe"), self, name="astype")

    def __getattr__(self, name):
        method = _METHODS.get(name)
        if method is None:
            raise AttributeError(f"'cupy.ndarray' object has no attribute '{name}'")
        return lambda *args, **kwargs: method(self, *args, **kwargs)

    def sort(self, axis=-1, kind=None):
        run_in_place(lambda a: a.sort(axis), self, name="sort")

    def __hash__(self):
        raise TypeError("unhashable type: 'cupy.ndarray'")


ndarray.__module__ = "cupy"
ndarray.__qualname__ = "ndarray"


def _contiguous_strides(shape, itemsize, order="C"):
    strides, step = [], itemsize
    for n in (reversed(shape) if order != "F" else shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides)) if order != "F" else tuple(strides)


def _index(key):
    """An index with cupy's conversions: lists and numpy arrays of indices become device arrays."""
    items = key if isinstance(key, tuple) else (key,)
    out = []
    for k in items:
        if isinstance(k, (list, numpy.ndarray)) or (isinstance(k, (bool, numpy.bool_))):
            k = asarray_index(k)
        out.append(k)
    return tuple(out) if isinstance(key, tuple) else out[0]


def asarray_index(k):
    host = numpy.asarray(k)
    if host.size == 0 and isinstance(k, list):
        host = host.astype(numpy.int32)
    if host.dtype.kind not in "biu":
        raise IndexError(f"arrays used as indices must be of integer or boolean type (actual: {host.dtype.type})")
    return to_device(host)


def _device_index(k):
    return asarray_index(k) if isinstance(k, (list, numpy.ndarray)) else k


def _has_array(key):
    return any(isinstance(k, ndarray) for k in (key if isinstance(key, tuple) else (key,)))


def _has_mask(key):
    return any(isinstance(k, ndarray) and k.dtype == numpy.bool_ for k in (key if isinstance(key, tuple) else (key,)))


def empty(shape, dtype=float, order="C"):
    return ndarray(shape, dtype, order=order)


_METHODS = {}  # filled by functions.py: the methods that are a cupy function of the array


# ---- copies between host and device ------------------------------------------------------------------
# Copies between host and device memory, as cupy makes them.
#
# - ``a.get()`` copies on the stream (the current one) and waits for it: the host sees the stream's work
#   up to the copy, and nothing of other streams' work it did not wait for. With ``blocking=False`` and a
#   page-locked ``out`` the copy is queued like any device work; into pageable memory it is synchronous
#   (``cudaMemcpyAsync`` returns only once a device-to-pageable copy is done).
# - ``a.set(host)`` and ``cupy.asarray(host)`` copy on the stream. From pageable memory the host data is
#   taken at the call (CUDA stages it); from page-locked memory (``cupyx.empty_pinned``, ``hostRegister``)
#   it is read when the stream runs the copy, so a host buffer overwritten before the copy ran shows.
# - A queued copy from or to page-locked memory reaches it through the device's mapping of that memory, which
#   ``hostUnregister`` takes away: one that runs after its range was unregistered raises cudaErrorIllegalAddress
#   where it is waited for (memory.check_pinned), as a device faults on an unmapped address.
# - Under capture, cupy refuses both directions with its RuntimeError before CUDA sees them.
#

def device_to_host(a, stream=None, order="C", out=None, blocking=True):
    stream = streams.get_current_stream() if stream is None else stream
    if out is not None:
        if not isinstance(out, numpy.ndarray):
            raise TypeError("Only numpy.ndarray can be obtained fromcupy.ndarray")
        if out.dtype != a.dtype:
            raise TypeError(f"{out.dtype} array cannot be obtained from {a.dtype} array")
        if out.shape != a.shape:
            raise ValueError(f"Shape mismatch. Expected shape: {a.shape}, actual shape: {out.shape}")
        if not (out.flags.c_contiguous or out.flags.f_contiguous):
            raise RuntimeError("`out` cannot be specified when copying to non-contiguous ndarray")
    elif a.size == 0:
        return numpy.ndarray(a.shape, dtype=a.dtype)
    else:
        order = order.upper()
        if order == "A":
            order = "F" if a.flags.f_contiguous else "C"
        if order not in "CF":
            raise ValueError(f"unsupported order: {order}")
        out = numpy.empty(a.shape, a.dtype, order=order)
    with Device(a.data.device_id):
        refuse_transfer("D2H", stream)
        if memory.is_pinned(out.ctypes.data, out.nbytes) and not blocking:
            streams.submit(_to_pinned, out, a, name="copy to host", stream=stream)
            return out
        stream.synchronize()
        out[...] = a._host
    return out


def host_to_device(a, arr, stream=None):
    if not isinstance(arr, numpy.ndarray):
        raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
    if a.dtype != arr.dtype:
        raise TypeError(f"{arr.dtype} array cannot be set to {a.dtype} array")
    if a.shape != arr.shape:
        raise ValueError(f"Shape mismatch. Old shape: {a.shape}, new shape: {arr.shape}")
    if a.flags.c_contiguous:
        arr = numpy.ascontiguousarray(arr)
    elif a.flags.f_contiguous:
        arr = numpy.asfortranarray(arr)
    else:
        raise RuntimeError("Cannot set to non-contiguous array")
    stream = streams.get_current_stream() if stream is None else stream
    with Device(a.data.device_id):
        refuse_transfer("H2D", stream)
        if memory.is_pinned(arr.ctypes.data, arr.nbytes):
            streams.submit(_from_pinned, a, arr, name="copy to device", stream=stream)
        else:
            streams.submit(numpy.copyto, a, arr.copy(), name="copy to device", stream=stream)


def _to_pinned(host, device):
    memory.check_pinned(host)
    numpy.copyto(host, device)


def _from_pinned(device, host):
    memory.check_pinned(host)
    numpy.copyto(device, host)


def to_device(obj, dtype=None, order="K"):
    """A new device array holding host data ``obj`` (a numpy array, a list, a scalar): cupy's ``array``."""
    refuse_transfer("H2D")
    host = numpy.array(obj, dtype=dtype, order="C" if order in ("K", "A", None) else order)
    out = empty(host.shape, host.dtype, order="F" if order == "F" else "C")
    if host.size:  # numpy.array copied obj: the copy may run later
        streams.submit(numpy.copyto, out, host, name="copy to device")
    return out
