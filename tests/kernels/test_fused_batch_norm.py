"""The Scale (+ ReLU) half of the fused BatchNorm kernels against the formulas, on numpy and cupy."""
import numpy
import pytest

from layerforge.kernels.fused_batch_norm import scale_shift_relu, scale_shift_relu_backward


def host(a):
    return a if isinstance(a, numpy.ndarray) else a.get()


@pytest.mark.parametrize("shape", [(2, 3, 5), (4, 1, 7), (3, 6, 1)])
@pytest.mark.parametrize("slope", [None, 0.0, 0.2])
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_forward_and_backward_match_the_formulas(xp, shape, slope, dtype):
    r = numpy.random.default_rng(1)
    x_norm, gy = r.standard_normal(shape), r.standard_normal(shape)
    gamma, beta = r.uniform(0.5, 2, shape[1]), r.uniform(-1, 1, shape[1])
    z = gamma[None, :, None] * x_norm + beta[None, :, None]
    y = z if slope is None else numpy.where(z > 0, z, slope * z)
    gz = gy if slope is None else numpy.where(z > 0, gy, slope * gy)
    d = lambda a: xp.asarray(a.astype(dtype))  # noqa: E731
    out = xp.empty(shape, dtype=dtype)
    scale_shift_relu(d(x_norm), d(gamma), d(beta), slope, out)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == numpy.float32 else dict(rtol=1e-13, atol=1e-14)
    numpy.testing.assert_allclose(host(out), y, **tol)
    g, g_gamma, g_beta = d(gy), xp.ones(shape[1], dtype=dtype), xp.zeros(shape[1], dtype=dtype)
    scale_shift_relu_backward(g, out, d(x_norm), d(gamma), slope, g_gamma, g_beta)
    numpy.testing.assert_allclose(host(g), gz * gamma[None, :, None], **tol)
    numpy.testing.assert_allclose(host(g_beta), gz.sum(axis=(0, 2)), **tol)
    numpy.testing.assert_allclose(host(g_gamma), 1 + (gz * x_norm).sum(axis=(0, 2)), **tol)  # accumulates
