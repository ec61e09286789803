"""GPU bodies of :func:`layerforge.kernels.im2col.im2col` / ``col2im`` (im2col.cu), same layout and results."""
from ..output_size import conv_output_size
from . import launch


def im2col_gpu(x, kh, kw, sy, sx, ph, pw, dy=1, dx=1):
    """Columns ``(C, kh, kw, N, out_h, out_w)`` of a cupy NCHW batch."""
    import cupy

    n, c, h, w = x.shape
    out_h, out_w = conv_output_size(h, kh, sy, ph, dy), conv_output_size(w, kw, sx, pw, dx)
    x = cupy.ascontiguousarray(x)
    col = cupy.empty((c, kh, kw, n, out_h, out_w), dtype=x.dtype)
    launch("im2col", "im2col", x.dtype, col.size,
           (x, col, col.size, n, c, h, w, kh, kw, sy, sx, ph, pw, dy, dx, out_h, out_w))
    return col


def col2im_gpu(col, sy, sx, ph, pw, h, w, dy=1, dx=1):
    """Sum cupy columns ``(C, kh, kw, N, out_h, out_w)`` back into an ``(N, C, h, w)`` image."""
    import cupy

    c, kh, kw, n, out_h, out_w = col.shape
    col = cupy.ascontiguousarray(col)
    gx = cupy.empty((n, c, h, w), dtype=col.dtype)
    launch("im2col", "col2im", col.dtype, gx.size,
           (col, gx, gx.size, n, c, h, w, kh, kw, sy, sx, ph, pw, dy, dx, out_h, out_w))
    return gx
