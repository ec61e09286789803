"""kernels.lrn: LRN across channels against PyTorch's local_response_norm (forward and gradient)."""
import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.kernels.lrn import lrn_across_backward, lrn_across_forward


@pytest.mark.parametrize("shape", [(2, 7, 3, 4), (1, 3, 1, 1)])
@pytest.mark.parametrize("size,alpha,beta,k", [(5, 1e-1, 0.75, 2.0), (3, 1.0, 0.5, 1.0), (1, 0.3, 1.3, 1.5)])
def test_matches_torch(xp, shape, size, alpha, beta, k):
    torch = pytest.importorskip("torch")
    rng = numpy.random.default_rng(0)
    x, gy = rng.normal(size=shape), rng.normal(size=shape)
    y, scale = lrn_across_forward(xp.asarray(x), size, alpha / size, k, beta)
    gx = lrn_across_backward(xp.asarray(x), scale, xp.asarray(gy), size, alpha / size, beta, xp.empty(shape))
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.nn.functional.local_response_norm(tx, size, alpha=alpha, beta=beta, k=k)
    ty.backward(torch.tensor(gy))
    numpy.testing.assert_allclose(to_numpy(y), ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    numpy.testing.assert_allclose(to_numpy(gx), tx.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_scale_by_hand(xp):
    # one pixel, channels 1, 2, 3, window 3: scale_c = k + alpha/3 * (sum of the neighbours' squares)
    x = xp.asarray(numpy.array([1.0, 2.0, 3.0]).reshape(1, 3, 1, 1))
    y, scale = lrn_across_forward(x, 3, 0.3 / 3, 1.0, 1.0)
    want = 1 + 0.1 * numpy.array([1 + 4, 1 + 4 + 9, 4 + 9])
    numpy.testing.assert_allclose(to_numpy(scale).ravel(), want, rtol=1e-14)
    numpy.testing.assert_allclose(to_numpy(y).ravel(), numpy.array([1.0, 2.0, 3.0]) / want, rtol=1e-14)


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("size,beta", [(5, 0.75), (3, 0.5), (5, 1), (1, 0.75), (7, 0.75)])
@pytest.mark.parametrize("shape", [(3, 7, 5, 6), (2, 4, 1, 3)])
def test_compiled_bodies_give_the_xp_bodies_bits(monkeypatch, dtype, size, beta, shape):
    """The host's compiled loops (the exponents taken by square roots) order every operation as the xp bodies do:
    y, scale and gx bit for bit, with scalars of the array's type as numpy's in-place operations take them."""
    from layerforge.kernels import lrn
    rng = numpy.random.default_rng(1)
    x, gy = (rng.standard_normal(shape) * 10).astype(dtype), rng.standard_normal(shape).astype(dtype)
    alpha_n, k = 1e-2 / size, 1.5
    ran = set()
    for name in ("_compiled_forward", "_compiled_backward"):
        monkeypatch.setattr(lrn, name, lambda *a, body=getattr(lrn, name), name=name: ran.add(name) or body(*a))
    y, scale = lrn_across_forward(x, size, alpha_n, k, beta)
    gx = lrn_across_backward(x, scale, gy, size, alpha_n, beta, numpy.empty_like(x))
    assert ran == {"_compiled_forward", "_compiled_backward"}
    want_y, want_scale, want_gx = (numpy.empty_like(x) for _ in range(3))
    lrn._across_forward(x, size, alpha_n, k, beta, want_y, want_scale)
    lrn._across_backward(x, scale, gy, size, alpha_n, beta, want_gx)
    for got, want in ((y, want_y), (scale, want_scale), (gx, want_gx)):
        assert got.dtype == dtype and got.tobytes() == want.tobytes()
