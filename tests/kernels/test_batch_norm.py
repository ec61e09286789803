"""kernels.batch_norm: batch statistics, normalisation and gradient against PyTorch's batch_norm."""
import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.kernels.batch_norm import batch_norm_backward, batch_stats


@pytest.mark.parametrize("shape", [(4, 3, 5), (2, 6, 70), (30, 2, 1)])
def test_matches_torch(xp, shape):
    torch = pytest.importorskip("torch")
    rng = numpy.random.default_rng(0)
    x, gy = rng.normal(2.0, 3.0, size=shape), rng.normal(size=shape)
    y = xp.empty(shape)
    mean, var = batch_stats(xp.asarray(x), centred=y)
    numpy.testing.assert_allclose(to_numpy(mean), x.mean(axis=(0, 2)), rtol=1e-12)
    numpy.testing.assert_allclose(to_numpy(var), x.var(axis=(0, 2)), rtol=1e-12)
    numpy.testing.assert_allclose(to_numpy(y), x - x.mean(axis=(0, 2))[None, :, None], rtol=1e-12, atol=1e-12)
    inv_std = 1 / xp.sqrt(var + 1e-5)
    y *= inv_std[None, :, None]
    gx = batch_norm_backward(xp.asarray(gy), y, inv_std, xp.empty(shape))
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.nn.functional.batch_norm(tx, None, None, training=True, eps=1e-5)
    ty.backward(torch.tensor(gy))
    numpy.testing.assert_allclose(to_numpy(y), ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    numpy.testing.assert_allclose(to_numpy(gx), tx.grad.numpy(), rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("shape", [(3, 2, 4), (4, 16, 300)])
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_backward_in_place(xp, shape, dtype):
    rng = numpy.random.default_rng(1)
    y, gy = (xp.asarray(rng.normal(size=shape).astype(dtype)) for _ in range(2))
    inv_std = xp.asarray(rng.uniform(0.5, 2.0, shape[1]).astype(dtype))
    want = to_numpy(batch_norm_backward(gy, y, inv_std, xp.empty(gy.shape, dtype=dtype)))
    # the same bits: in place the loop writes through gy itself (kernels.batch_norm._input_grad)
    numpy.testing.assert_array_equal(to_numpy(batch_norm_backward(gy, y, inv_std, gy)), want)


@pytest.mark.parametrize("offset", [0.0, 1e3, -5e4])
def test_float32_statistics_are_summed_in_float64(offset):
    # 200K float32 values around a large mean: naive float32 sums lose the variance; the CPU loops add in
    # float64 and round once, so mean and variance are the float64 figures rounded to float32
    rng = numpy.random.default_rng(5)
    x64 = rng.normal(offset, 0.5, size=(8, 2, 12544))
    x = x64.astype(numpy.float32)
    mean, var = batch_stats(x)
    assert mean.dtype == var.dtype == numpy.float32
    want_mean, want_var = x.astype(numpy.float64).mean(axis=(0, 2)), x.astype(numpy.float64).var(axis=(0, 2))
    numpy.testing.assert_allclose(mean, want_mean, rtol=1e-7, atol=1e-7)
    numpy.testing.assert_allclose(var, want_var, rtol=1e-6)


class _OneReplicaGroup:
    count = 1

    def __init__(self):
        self.calls = 0

    def sum(self, values):
        self.calls += 1
        return values


@pytest.mark.parametrize("offset", [0.0, 1e3, -5e4])
def test_a_group_exchanges_once_and_twice_only_for_a_large_mean(offset):
    # one pass sums x and x^2; a mean large against the spread takes a second pass (and exchange) about the mean
    rng = numpy.random.default_rng(6)
    x = rng.normal(offset, 0.5, size=(8, 2, 12544)).astype(numpy.float32)
    want_mean, want_var = x.astype(numpy.float64).mean(axis=(0, 2)), x.astype(numpy.float64).var(axis=(0, 2))
    group = _OneReplicaGroup()
    mean, var = batch_stats(x, group=group)
    assert group.calls == (1 if offset == 0 else 2)
    numpy.testing.assert_allclose(mean, want_mean, rtol=1e-7, atol=1e-7)
    numpy.testing.assert_allclose(var, want_var, rtol=1e-6)
    solo = batch_stats(x)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(solo, (mean, var)))  # a group of one is one process


def test_only_the_channels_with_a_large_mean_take_a_second_pass():
    # every other channel around 3e3 (mean^2 / var > REFINE_RATIO): those are summed again about their mean, the
    # others keep their one pass; alone or as a group of one, the same bits
    rng = numpy.random.default_rng(8)
    x = rng.normal(0.0, 0.5, size=(4, 6, 3000))
    x[:, ::2] += 3e3
    x = x.astype(numpy.float32)
    want_var = x.astype(numpy.float64).var(axis=(0, 2))
    solo, grouped = batch_stats(x), batch_stats(x, group=_OneReplicaGroup())
    numpy.testing.assert_allclose(solo[1], want_var, rtol=1e-6)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(solo, grouped))
    one_pass = batch_stats(x[:, 1::2])  # the small channels alone: none takes a second pass
    assert all(a[1::2].tobytes() == b.tobytes() for a, b in zip(solo, one_pass))


def test_normalize_in_place_and_into_a_buffer():
    from layerforge.kernels.batch_norm import normalize
    rng = numpy.random.default_rng(6)
    x = rng.normal(size=(3, 4, 5)).astype(numpy.float32)
    mean, inv_std = rng.normal(size=4), rng.uniform(0.5, 2, size=4)
    want = ((x - mean[None, :, None].astype(numpy.float32)) * inv_std[None, :, None].astype(numpy.float32))
    out = normalize(x, mean, inv_std, numpy.empty_like(x))
    numpy.testing.assert_array_equal(out, want)
    numpy.testing.assert_array_equal(normalize(x, mean, inv_std, x), want)  # x itself


@pytest.mark.parametrize("shape", [(2, 3, 5), (4, 16, 77), (3, 6, 1), (8, 5, 3136)])
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("slope,affine", [(None, False), (0.0, False), (0.2, False), (0.0, True), (0.2, True)])
@pytest.mark.parametrize("batch_stats", [True, False])
@pytest.mark.parametrize("in_place", [False, True])
def test_one_sweep_gives_the_bits_of_the_two_passes(shape, dtype, slope, affine, batch_stats, in_place):
    # sums_and_input_grad runs grad_sums' and input_grad's loops channel by channel, their coefficients rounded as
    # the two passes' array expressions round them (coef * S2 / m in the data's type)
    from layerforge.kernels.batch_norm import grad_sums, input_grad, sums_and_input_grad
    rng = numpy.random.default_rng(7)
    x_norm, gy = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    gamma, beta = rng.uniform(-2, 2, shape[1]).astype(dtype), rng.uniform(-1, 1, shape[1]).astype(dtype)
    coef_gz = gamma * rng.uniform(0.5, 2, shape[1]).astype(dtype)
    y = numpy.maximum(gamma[None, :, None] * x_norm + beta[None, :, None], 0)
    vectors = (gamma, beta) if affine else None
    s1, s2 = grad_sums(gy, y, slope, x_norm, vectors)
    m = shape[0] * shape[2]
    coef_xn, shift = (coef_gz * s2 / m, coef_gz * s1 / m) if batch_stats else (numpy.zeros_like(s1),) * 2
    want = input_grad(gy, y, slope, x_norm, coef_gz, coef_xn, shift, numpy.empty_like(gy), vectors)
    g = gy.copy()
    got = g if in_place else numpy.full_like(gy, numpy.nan)
    sums = sums_and_input_grad(g, y, slope, x_norm, coef_gz, batch_stats, got, vectors)
    assert got.tobytes() == want.tobytes()
    assert all(a.dtype == dtype and a.tobytes() == b.tobytes() for a, b in zip(sums, (s1, s2)))
