"""GPU body of the IMPLICIT convolution engine (implicit_gemm.cu): tiled implicit GEMM, no column buffer."""
import math

from ..output_size import conv_output_size
from . import run

TILE = 16  # implicit_gemm.cu's TILE
SPLIT_CHUNK = 4096  # (n, p) positions per block of the filter gradient's split reduction (a multiple of TILE)
MAX_GRID_Z = 65535


def _geometry(x_shape, w_shape, geometry, group):
    kh, kw, sy, sx, ph, pw, dy, dx = geometry
    n, c, h, w = x_shape
    out_h, out_w = conv_output_size(h, kh, sy, ph, dy), conv_output_size(w, kw, sx, pw, dx)
    return (n, c, h, w, w_shape[0], group, kh, kw, sy, sx, ph, pw, dy, dx, out_h, out_w)


def _run(name, dtype, rows, cols, depth, args):
    grid = (math.ceil(cols / TILE), math.ceil(rows / TILE), depth)
    run("implicit_gemm", name, dtype, grid, (TILE, TILE), args)


def split_chunk(reduce, group):
    """Chunk of the filter gradient's reduction per block: SPLIT_CHUNK, grown so the grid's z fits."""
    chunk = SPLIT_CHUNK
    while group * math.ceil(reduce / chunk) > MAX_GRID_Z:
        chunk *= 2
    return chunk


def conv_forward_gpu(x, W, b, y, geometry, group):
    """Write ``W * x (+ b)`` into the contiguous cupy array ``y`` (N, Cout, out_h, out_w)."""
    import cupy

    x, W = cupy.ascontiguousarray(x), cupy.ascontiguousarray(W)
    q = _geometry(x.shape, W.shape, geometry, group)
    n, out_h, out_w = q[0], q[-2], q[-1]
    _run("conv_forward", x.dtype, W.shape[0] // group, n * out_h * out_w, group, (x, W, y) + q)
    if b is not None:
        y += b[:, None, None]


def conv_backward_gpu(x, W, gy, gW, gb, gx, geometry, group):
    """Add the filter (and bias) gradients into ``gW`` (``gb``); write the data gradient into ``gx``.

    Any of ``gW``, ``gb``, ``gx`` may be None (not wanted).
    """
    import cupy

    x, W, gy = cupy.ascontiguousarray(x), cupy.ascontiguousarray(W), cupy.ascontiguousarray(gy)
    q = _geometry(x.shape, W.shape, geometry, group)
    n, c, h, w = x.shape
    if gb is not None:
        gb += gy.sum(axis=(0, 2, 3))
    if gW is not None:
        reduce = n * q[-2] * q[-1]
        chunk = split_chunk(reduce, group)
        _run("conv_backward_filter", x.dtype, W.shape[0] // group, W[0].size, group * math.ceil(reduce / chunk),
             (x, gy, gW) + q + (chunk,))
    if gx is not None:
        _run("conv_backward_data", x.dtype, c // group, n * h * w, group, (gy, W, gx) + q)
