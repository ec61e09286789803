import numpy
import pytest

from layerforge.kernels.im2col import col2im_cpu, im2col_cpu
from layerforge.kernels.output_size import conv_output_size
from layerforge.kernels import implicit_gemm
from layerforge.kernels.implicit_gemm import ENGINES, ImplicitGemmConv, Im2colConv, NdIm2colConv, gemm_shape
from layerforge.kernels.threadpool import num_threads, set_num_threads

GEOMETRIES = [  # kh, kw, sy, sx, ph, pw, dy, dx, group
    (3, 3, 1, 1, 0, 0, 1, 1, 1),
    (3, 3, 2, 2, 1, 1, 1, 1, 1),
    (1, 1, 1, 1, 0, 0, 1, 1, 1),
    (1, 1, 2, 2, 0, 0, 1, 1, 1),
    (3, 3, 1, 1, 2, 2, 2, 2, 1),
    (2, 3, 2, 1, 1, 0, 1, 2, 2),
    (5, 5, 1, 1, 2, 2, 1, 1, 4),
]


def reference(x, W, b, gy, geom):
    """Forward and gradients through the (separately tested) im2col_cpu / col2im_cpu and einsum."""
    kh, kw, sy, sx, ph, pw, dy, dx, g = geom
    n, c, h, w = x.shape
    col = im2col_cpu(x, kh, kw, sy, sx, ph, pw, dy, dx)  # (C, kh, kw, N, oh, ow)
    oh, ow = col.shape[4:]
    colg = col.reshape(g, -1, n, oh, ow)
    Wg = W.reshape(g, W.shape[0] // g, -1)
    y = numpy.einsum("gok,gknyx->ngoyx", Wg, colg).reshape(n, -1, oh, ow) + b[:, None, None]
    gyg = gy.reshape(n, g, -1, oh, ow)
    gW = numpy.einsum("ngoyx,gknyx->gok", gyg, colg).reshape(W.shape)
    gcol = numpy.einsum("gok,ngoyx->gknyx", Wg, gyg).reshape(col.shape)
    gx = col2im_cpu(gcol, sy, sx, ph, pw, h, w, dy, dx)
    return y, gW, gy.sum(axis=(0, 2, 3)), gx


def run(engine, x, W, b, gy, geom):
    y = numpy.empty(gy.shape, x.dtype)
    gW, gb, gx = numpy.zeros_like(W), numpy.zeros_like(b), numpy.empty_like(x)
    engine.forward(x, W, b, y)
    engine.backward(x, W, gy, gW, gb, gx)
    return y, gW, gb, gx


def make(geom, shape=(3, 4, 9, 8), cout=4, seed=0):
    kh, kw, sy, sx, ph, pw, dy, dx, g = geom
    rng = numpy.random.default_rng(seed)
    x = rng.standard_normal(shape)
    W = rng.standard_normal((cout, shape[1] // g, kh, kw))
    b = rng.standard_normal(cout)
    oh, ow = conv_output_size(shape[2], kh, sy, ph, dy), conv_output_size(shape[3], kw, sx, pw, dx)
    gy = rng.standard_normal((shape[0], cout, oh, ow))
    return x, W, b, gy


@pytest.mark.parametrize("geom", GEOMETRIES)
@pytest.mark.parametrize("name, budget", [("IM2COL", None), ("IMPLICIT", None), ("IMPLICIT", 2000),
                                          ("IMPLICIT", 1)])
def test_engines_match_the_reference(geom, name, budget):
    x, W, b, gy = make(geom)
    engine = ENGINES[name](geom[:8], geom[8]) if budget is None else ImplicitGemmConv(geom[:8], geom[8], budget)
    got = run(engine, x, W, b, gy, geom)
    for a, e in zip(got, reference(x, W, b, gy, geom)):
        numpy.testing.assert_allclose(a, e, rtol=1e-10, atol=1e-10)
    again = run(engine, x, W, b, gy, geom)  # reused workspaces give the same answer
    for a, e in zip(again, got):
        numpy.testing.assert_array_equal(a, e)


def test_backward_without_data_gradient_and_without_bias():
    geom = GEOMETRIES[1]
    x, W, b, gy = make(geom)
    _, gW_ref, _, _ = reference(x, W, b, gy, geom)
    for cls in (Im2colConv, ImplicitGemmConv):
        gW = numpy.full_like(W, 1.0)  # gradients add into what is there
        cls(geom[:8], 1).backward(x, W, gy, gW, None, None)
        numpy.testing.assert_allclose(gW, gW_ref + 1.0, rtol=1e-10)


@pytest.mark.parametrize("budget", [1, 500, 3000, 10 ** 6])
def test_implicit_tiles_cover_every_output_once_within_the_budget(budget):
    engine = ImplicitGemmConv((3, 3, 1, 1, 1, 1, 1, 1), 1, budget)
    shape = (5, 2, 7, 6)
    seen, rows = numpy.zeros((5, 7), int), set()
    for n0, n1, r0, r1 in engine.tiles(shape, 8):
        seen[n0:n1, r0:r1] += 1
        assert n1 - n0 == 1 or (r0, r1) == (0, 7)
        assert (n1 - n0) * (r1 - r0) * 2 * 9 * 6 * 8 <= max(budget, 2 * 9 * 6 * 8)  # one row at least
        rows.add(r1 - r0)
    assert (seen == 1).all()
    assert max(rows) - min(rows) <= 1  # an image's rows dealt evenly (AlexNet's conv1: 28 + 27, not 52 + 3)


@pytest.mark.parametrize("geom", GEOMETRIES)
@pytest.mark.parametrize("budget", [None, 2000, 1])  # whole images a tile, an image's rows, a row a tile
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("apart", [True, False])
def test_implicit_gives_the_same_bits_on_one_thread_and_with_its_tiles_over_three(monkeypatch, geom, budget, dtype,
                                                                                   apart):
    """The tiles run on the kernel threads, each lowered and multiplied by one of them (the data gradient an image's
    tiles on one thread, the filter gradient each image's apart, or tile by tile): every value is the same product
    or sum whichever thread computes it."""
    monkeypatch.setattr(implicit_gemm, "PARTIAL_BYTES", implicit_gemm.PARTIAL_BYTES if apart else 0)
    x, W, b, gy = (a.astype(dtype) for a in make(geom, shape=(5, 4, 9, 8)))
    engine = ImplicitGemmConv(geom[:8], geom[8], budget)
    try:
        set_num_threads(1)
        alone = run(engine, x, W, b, gy, geom)
        set_num_threads(3)
        # (a 1x1 layer is one tile: x is its columns, and its products' stack is shared out by blas.matmul)
        assert len(engine._groups(engine.tiles(x.shape, x.itemsize), whole_images=True)) == (
            1 if engine.pointwise else 3)
        shared = run(engine, x, W, b, gy, geom)
    finally:
        set_num_threads(None)
    for got, want in zip(shared, alone):
        numpy.testing.assert_array_equal(got, want)
    for got, want in zip(shared, reference(x, W, b, gy, geom)):
        numpy.testing.assert_allclose(got, want, rtol=1e-4 if dtype == numpy.float32 else 1e-10, atol=1e-4)


def test_implicit_deals_whole_images_evenly_a_tile_a_thread_at_least():
    engine = ImplicitGemmConv((3, 3, 2, 2, 1, 1, 1, 1), 1, budget=5 * 2 * 9 * 4 * 4 * 4)  # 5 images' columns
    try:
        set_num_threads(2)
        assert engine.tiles((8, 2, 8, 8)) == [(0, 4, 0, 4), (4, 8, 0, 4)]  # 4 + 4, not 5 + 3
        assert engine.tiles((1, 2, 8, 8)) == [(0, 1, 0, 4)]
        set_num_threads(3)
        assert engine.tiles((4, 2, 8, 8)) == [(0, 1, 0, 4), (1, 2, 0, 4), (2, 4, 0, 4)]
    finally:
        set_num_threads(None)


def test_workspace_bytes():
    x, W, b, gy = make((3, 3, 1, 1, 1, 1, 1, 1, 1), shape=(8, 4, 16, 16), cout=6)
    x, W, b, gy = (a.astype(numpy.float32) for a in (x, W, b, gy))
    geom = (3, 3, 1, 1, 1, 1, 1, 1)
    full = Im2colConv(geom, 1)
    run(full, x, W, b, gy, geom + (1,))
    col = 4 * 9 * 16 * 16 * 8 * 4
    assert full.workspace_bytes == col + 2 * 4 * 18 * 18 * 8 * 4 + 6 * 16 * 16 * 8 * 4  # col, x/gx pads, y
    tiled = ImplicitGemmConv(geom, 1, budget=col // 8)
    run(tiled, x, W, b, gy, geom + (1,))
    assert 0 < tiled.workspace_bytes <= num_threads() * col // 8  # a tile's columns per kernel thread
    tiled.release()
    assert tiled.workspace_bytes == 0


def test_gemm_shape():
    assert gemm_shape((8, 64, 56, 56), (64, 64, 3, 3), (3, 3, 1, 1, 1, 1, 1, 1), 1) == (64, 8 * 56 * 56, 576)
    assert gemm_shape((2, 4, 9, 9), (6, 2, 3, 3), (3, 3, 2, 2, 0, 0, 1, 1), 2) == (3, 2 * 16, 18)


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)])
def test_add_matmul_accumulates_in_place(dtype, ta, tb, monkeypatch):
    from layerforge.kernels import blas
    from layerforge.kernels.blas import add_matmul
    monkeypatch.setattr(blas, "MIN_BYTES", 0)  # the in-place BLAS path even for this small c
    rng = numpy.random.default_rng(7)
    a = rng.standard_normal((5, 4) if ta else (4, 5)).astype(dtype)
    b = rng.standard_normal((3, 5) if tb else (5, 3)).astype(dtype)
    a, b = (a.T if ta else a), (b.T if tb else b)
    c = rng.standard_normal((4, 3)).astype(dtype)
    expected = c + a @ b
    out = add_matmul(c, a, b)
    assert out is c
    numpy.testing.assert_allclose(c, expected, rtol=1e-5 if dtype == numpy.float32 else 1e-12)


@pytest.mark.parametrize("geom", GEOMETRIES)
def test_nd_engine_on_two_axes_matches_the_reference(geom):
    x, W, b, gy = make(geom)
    kh, kw, sy, sx, ph, pw, dy, dx, g = geom
    engine = NdIm2colConv(((kh, kw), (sy, sx), (ph, pw), (dy, dx)), g)
    for a, e in zip(run(engine, x, W, b, gy, geom), reference(x, W, b, gy, geom)):
        numpy.testing.assert_allclose(a, e, rtol=1e-10, atol=1e-12)
    gx = numpy.full_like(x, 7.0)  # backward writes gx (no accumulation) and skips gW and gb when not asked
    engine.backward(x, W, gy, None, None, gx)
    numpy.testing.assert_allclose(gx, reference(x, W, b, gy, geom)[3], rtol=1e-10, atol=1e-12)


ADD_CASES = [  # (engine, kh, kw, sy, sx, ph, pw, dy, dx, group): each engine's data-gradient paths
    ("IM2COL", 3, 3, 2, 2, 1, 1, 1, 1, 1),
    ("IMPLICIT", 1, 1, 1, 1, 0, 0, 1, 1, 1),  # x its own columns: the product adds (beta = 1)
    ("IMPLICIT", 3, 3, 1, 1, 1, 1, 1, 1, 2),  # lowered: the scatter adds, nothing zeroed
    ("IMPLICIT", 1, 1, 2, 2, 0, 0, 1, 1, 1),
    ("WINOGRAD", 3, 3, 1, 1, 1, 1, 1, 1, 1),
    ("WINOGRAD_F2", 3, 3, 1, 1, 0, 0, 1, 1, 1),
    ("WINOGRAD_F2", 5, 5, 1, 1, 2, 2, 1, 1, 1),
    ("WINOGRAD", 5, 5, 2, 2, 1, 1, 1, 1, 1),  # over space-to-depth blocks
    ("IM2COL_ND", 3, 3, 1, 1, 1, 1, 1, 1, 1),
]


@pytest.mark.parametrize("case, contiguous", [(case, True) for case in ADD_CASES] + [
    (case, False) for case in ADD_CASES if case[0] != "IMPLICIT"],  # (IMPLICIT writes a contiguous gx only)
    ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) else ("contiguous" if v else "strided"))
def test_backward_adds_the_data_gradient_where_asked(xp, case, contiguous):
    """``add_gx``: gx + the data gradient, what a Split's sum of it and another consumer's would be (Net's split
    sums), for every engine on both backends, into a contiguous gx and a strided view."""
    from layerforge.backend import to_numpy
    name, *geom = case
    x, W, b, gy = make(tuple(geom), shape=(2, 4, 9, 8), cout=6, seed=3)
    x, W, gy = (a.astype(numpy.float32) for a in (x, W, gy))
    kh, kw, sy, sx, ph, pw, dy, dx, g = geom
    if name == "IM2COL_ND":
        engine = NdIm2colConv(((kh, kw), (sy, sx), (ph, pw), (dy, dx)), g)
    else:
        engine = ENGINES[name]((kh, kw, sy, sx, ph, pw, dy, dx), g)
    before = numpy.random.default_rng(4).standard_normal(x.shape).astype(numpy.float32)
    plain = xp.empty(x.shape, numpy.float32)
    engine.backward(xp.asarray(x), xp.asarray(W), xp.asarray(gy), None, None, plain)
    room = xp.zeros(x.shape[:3] + (x.shape[3] + 3,), numpy.float32)
    added = room[..., :x.shape[3]] if not contiguous else xp.empty(x.shape, numpy.float32)
    added[...] = xp.asarray(before)
    engine.backward(xp.asarray(x), xp.asarray(W), xp.asarray(gy), None, None, added, True)
    expected = before + to_numpy(plain)
    numpy.testing.assert_allclose(to_numpy(added), expected, rtol=0, atol=1e-5 * numpy.abs(expected).max())
    assert not contiguous or float(abs(to_numpy(plain)).max()) > 1  # (a gradient that is not zero was added)
    if not contiguous:
        numpy.testing.assert_array_equal(to_numpy(room[..., x.shape[3]:]), 0)  # nothing written past the view
