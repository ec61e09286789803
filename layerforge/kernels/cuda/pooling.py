"""GPU bodies of the pooling entry points in :mod:`layerforge.kernels.pooling` (pooling.cu).

Same arguments and results as the CPU bodies; ``argmax`` is int32 here (the CPU body's uint8 fits in it).
"""
from . import launch


def _args(x_shape, kh, kw, sy, sx, ph, pw, out_h, out_w):
    return (x_shape[2], x_shape[3], kh, kw, sy, sx, ph, pw, out_h, out_w)


def _contiguous(a):
    import cupy

    return cupy.ascontiguousarray(a)


def _store(out, result):
    # kernels write contiguous buffers; a caller's strided ``out`` gets a copy
    if out is not None and out is not result:
        out[...] = result
        return out
    return result


def _buffer(out, shape, dtype):
    import cupy

    return out if out is not None and out.flags.c_contiguous else cupy.empty(shape, dtype=dtype)


def max_pooling_forward_gpu(x, kh, kw, sy, sx, ph, pw, out_h, out_w, out=None):
    import cupy

    x = _contiguous(x)
    shape = (x.shape[0], x.shape[1], out_h, out_w)
    y = _buffer(out, shape, x.dtype)
    argmax = cupy.empty(shape, dtype=cupy.int32)
    launch("pooling", "max_pool_forward", x.dtype, y.size,
           (x, y, argmax, y.size) + _args(x.shape, kh, kw, sy, sx, ph, pw, out_h, out_w))
    return _store(out, y), argmax


def max_pooling_backward_gpu(gy, argmax, x_shape, kh, kw, sy, sx, ph, pw, out=None):
    import cupy

    gy = _contiguous(gy)
    argmax = cupy.ascontiguousarray(argmax, dtype=cupy.int32)
    gx = _buffer(out, tuple(x_shape), gy.dtype)
    launch("pooling", "max_pool_backward", gy.dtype, gx.size,
           (gy, argmax, gx, gx.size) + _args(x_shape, kh, kw, sy, sx, ph, pw, *gy.shape[2:]))
    return _store(out, gx)


def average_pooling_forward_gpu(x, kh, kw, sy, sx, ph, pw, out_h, out_w, out=None):
    x = _contiguous(x)
    y = _buffer(out, (x.shape[0], x.shape[1], out_h, out_w), x.dtype)
    launch("pooling", "ave_pool_forward", x.dtype, y.size,
           (x, y, y.size) + _args(x.shape, kh, kw, sy, sx, ph, pw, out_h, out_w))
    return _store(out, y)


def average_pooling_backward_gpu(gy, x_shape, kh, kw, sy, sx, ph, pw, out=None):
    gy = _contiguous(gy)
    gx = _buffer(out, tuple(x_shape), gy.dtype)
    launch("pooling", "ave_pool_backward", gy.dtype, gx.size,
           (gy, gx, gx.size) + _args(x_shape, kh, kw, sy, sx, ph, pw, *gy.shape[2:]))
    return _store(out, gx)
