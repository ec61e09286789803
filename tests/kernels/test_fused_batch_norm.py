"""The fused BatchNorm + Scale (+ ReLU) kernels against the formulas, on numpy and cupy; the .cu entry points."""
import numpy
import pytest

from layerforge.kernels import cuda
from layerforge.kernels.batch_norm import normalize
from layerforge.kernels.fused_batch_norm import bn_scale_relu_backward, normalize_scale_shift_relu, scale_shift_relu


def host(a):
    return a if isinstance(a, numpy.ndarray) else a.get()


@pytest.mark.parametrize("shape", [(2, 3, 5), (4, 1, 7), (3, 6, 1)])
@pytest.mark.parametrize("slope", [None, 0.0, 0.2])
@pytest.mark.parametrize("batch_stats", [True, False])
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_forward_and_backward_match_the_formulas(xp, shape, slope, batch_stats, dtype):
    r = numpy.random.default_rng(1)
    x_norm, gy = r.standard_normal(shape), r.standard_normal(shape)
    gamma, beta, inv_std = r.uniform(0.5, 2, shape[1]), r.uniform(-1, 1, shape[1]), r.uniform(0.5, 2, shape[1])
    ch = lambda v: v[None, :, None]  # noqa: E731
    z = ch(gamma) * x_norm + ch(beta)
    y = z if slope is None else numpy.where(z > 0, z, slope * z)
    gz = gy if slope is None else numpy.where(z > 0, gy, slope * gy)
    g_xn = gz * ch(gamma)  # the chain rule through Scale, then BatchNorm's own formula
    m = shape[0] * shape[2]
    if batch_stats:
        gx = (g_xn - g_xn.sum(axis=(0, 2), keepdims=True) / m
              - x_norm * (g_xn * x_norm).sum(axis=(0, 2), keepdims=True) / m) * ch(inv_std)
    else:
        gx = g_xn * ch(inv_std)
    d = lambda a: xp.asarray(a.astype(dtype))  # noqa: E731
    out = xp.empty(shape, dtype=dtype)
    scale_shift_relu(d(x_norm), d(gamma), d(beta), slope, out)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == numpy.float32 else dict(rtol=1e-12, atol=1e-13)
    numpy.testing.assert_allclose(host(out), y, **tol)
    g, g_gamma, g_beta = d(gy), xp.ones(shape[1], dtype=dtype), xp.zeros(shape[1], dtype=dtype)
    bn_scale_relu_backward(g, out, d(x_norm), d(inv_std), d(gamma), slope, batch_stats, g_gamma, g_beta, gx=g)
    numpy.testing.assert_allclose(host(g), gx, **tol)
    numpy.testing.assert_allclose(host(g_beta), gz.sum(axis=(0, 2)), **tol)
    numpy.testing.assert_allclose(host(g_gamma), 1 + (gz * x_norm).sum(axis=(0, 2)), **tol)  # accumulates


@pytest.mark.parametrize("shape", [(2, 3, 5), (4, 1, 7), (3, 6, 1), (2, 64, 49)])
@pytest.mark.parametrize("slope", [None, 0.0, 0.2])
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_normalize_scale_shift_relu_is_the_two_passes_bit_for_bit(xp, shape, slope, dtype):
    r = numpy.random.default_rng(3)
    x = xp.asarray((r.standard_normal(shape) * 3 + 1).astype(dtype))
    vectors = (r.uniform(-1, 2, shape[1]), r.uniform(0.2, 2, shape[1]), r.uniform(-2, 2, shape[1]),
               r.uniform(-1, 1, shape[1]))
    mean, inv_std, gamma, beta = (xp.asarray(v.astype(dtype)) for v in vectors)
    want_norm = normalize(x, mean, inv_std, xp.empty(shape, dtype=dtype))
    want = scale_shift_relu(want_norm, gamma, beta, slope, xp.empty(shape, dtype=dtype))
    x_norm = xp.full(shape, numpy.nan, dtype=dtype)
    assert normalize_scale_shift_relu(x, mean, inv_std, gamma, beta, slope, x_norm) is x  # in place
    numpy.testing.assert_array_equal(host(x_norm), host(want_norm))
    numpy.testing.assert_array_equal(host(x), host(want))


@pytest.mark.parametrize("shape", [(2, 3, 5), (4, 16, 77)])
@pytest.mark.parametrize("slope", [0.0, 0.2])
@pytest.mark.parametrize("batch_stats", [True, False])
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("input_grad", [True, False])
def test_the_mask_from_x_norm_gives_the_bits_of_the_mask_from_y(shape, slope, batch_stats, dtype, input_grad):
    # backward's ReLU mask recomputed as gamma x_norm + beta > 0 (affine) against the forward's output y; many
    # values sit on the ReLU's edge: x_norm = -beta / gamma rounded, and exact zeros
    r = numpy.random.default_rng(5)
    gamma, beta = r.uniform(-2, 2, shape[1]).astype(dtype), r.uniform(-1, 1, shape[1]).astype(dtype)
    x_norm = r.standard_normal(shape).astype(dtype)
    x_norm[:, :, ::3] = (-beta / gamma)[None, :, None].astype(dtype)
    x_norm[:, :, 1::7] = 0
    beta[0] = 0
    x = (x_norm * 1.5 + 0.25).astype(dtype)
    mean, inv_std = numpy.full(shape[1], 0.25, dtype), numpy.full(shape[1], 1 / 1.5, dtype)
    y, kept = x.copy(), numpy.empty(shape, dtype)
    normalize_scale_shift_relu(y, mean, inv_std, gamma, beta, slope, kept)
    gy = r.standard_normal(shape).astype(dtype)
    results = []
    for affine in (None, (gamma, beta)):
        g, g_gamma, g_beta = gy.copy(), numpy.zeros(shape[1], dtype), numpy.zeros(shape[1], dtype)
        bn_scale_relu_backward(g, y if affine is None else numpy.full(shape, numpy.nan, dtype), kept, inv_std, gamma,
                               slope, batch_stats, g_gamma, g_beta, gx=g if input_grad else None, affine=affine)
        results.append((g, g_gamma, g_beta))
    for want, got in zip(*results):
        assert got.tobytes() == want.tobytes()


def test_only_what_is_asked_for_is_written(xp):
    shape = (2, 3, 4)
    r = numpy.random.default_rng(2)
    x_norm, gy = (xp.asarray(r.standard_normal(shape)) for _ in range(2))
    gamma, inv_std = xp.ones(3), xp.ones(3)
    y = scale_shift_relu(x_norm, gamma, xp.zeros(3), 0.0, xp.empty(shape))
    g_beta = xp.zeros(3)
    assert bn_scale_relu_backward(gy, y, x_norm, inv_std, gamma, 0.0, True, None, g_beta, gx=None) is None
    assert host(g_beta).any()


def test_the_cuda_source_defines_what_the_launchers_run():
    text = cuda.sources()["fused_batch_norm"].read_text()
    for name in ("scale_shift_relu", "fused_grad_sums", "fused_backward"):
        assert f'extern "C" __global__ void {name}(' in text


@pytest.mark.parametrize("shape", [(2, 3, 5), (4, 16, 77), (3, 6, 1)])
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("slope", [None, 0.0, 0.2])
@pytest.mark.parametrize("offset", [0.0, 1e3, "every other channel"])
def test_statistics_and_forward_in_one_sweep_give_the_bits_of_the_two_steps(shape, dtype, slope, offset):
    # the batch's statistics, then 1 / sqrt(var + eps) and the fused forward, a channel at a time; a large mean takes
    # a second pass about it (in every channel, or every other one)
    from layerforge.kernels.batch_norm import batch_stats
    from layerforge.kernels.fused_batch_norm import batch_normalize_scale_shift_relu
    r = numpy.random.default_rng(4)
    x = r.standard_normal(shape) * 0.5
    if offset == "every other channel":
        x[:, ::2] += 3e3
    else:
        x += offset
    x = x.astype(dtype)
    gamma, beta = r.uniform(-2, 2, shape[1]).astype(dtype), r.uniform(-1, 1, shape[1]).astype(dtype)
    mean, var = batch_stats(x)
    want, want_norm = x.copy(), numpy.empty_like(x)
    normalize_scale_shift_relu(want, mean, 1 / numpy.sqrt(var + 1e-5).astype(dtype), gamma, beta, slope, want_norm)
    got, got_norm = x.copy(), numpy.full_like(x, numpy.nan)
    statistics = batch_normalize_scale_shift_relu(got, 1e-5, gamma, beta, slope, got_norm)
    for a, b in zip((got, got_norm) + statistics, (want, want_norm, mean, var)):
        assert a.dtype == dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("shape", [(2, 3, 5), (4, 16, 77), (3, 6, 1)])
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("slope", [0.0, 0.2])
@pytest.mark.parametrize("offset", [0.0, "every other channel"])
def test_the_residual_sum_and_relu_in_the_sweep_give_the_bits_of_the_join_after_it(shape, dtype, slope, offset):
    # ResNet's block end (net/fusion.BatchNormScaleSumReLU): x = gamma x_norm + beta, out = relu(x + residual), one
    # loop; a NaN and a -inf in the residual take sum_relu's values
    from layerforge.kernels.fused_batch_norm import batch_normalize_scale_shift_relu
    from layerforge.kernels.relu import sum_relu
    r = numpy.random.default_rng(5)
    x = r.standard_normal(shape) * 0.5 + (0 if offset == 0.0 else numpy.arange(shape[1])[:, None] % 2 * 3e3)
    x, residual = x.astype(dtype), r.standard_normal(shape).astype(dtype)
    residual.flat[0], residual.flat[-1] = numpy.nan, -numpy.inf
    gamma, beta = r.uniform(-2, 2, shape[1]).astype(dtype), r.uniform(-1, 1, shape[1]).astype(dtype)
    want, want_norm, want_out = x.copy(), numpy.empty_like(x), numpy.empty_like(x)
    want_stats = batch_normalize_scale_shift_relu(want, 1e-5, gamma, beta, None, want_norm)
    sum_relu(want, residual, slope, want_out)
    got, got_norm, got_out = x.copy(), numpy.full_like(x, numpy.nan), numpy.full_like(x, numpy.nan)
    got_stats = batch_normalize_scale_shift_relu(got, 1e-5, gamma, beta, slope, got_norm, residual, got_out)
    for a, b in zip((got, got_norm, got_out) + got_stats, (want, want_norm, want_out) + want_stats):
        assert a.dtype == dtype and a.tobytes() == b.tobytes()
    assert numpy.isnan(got_out.flat[0]) and (got_out == 0).any() == (slope == 0)
