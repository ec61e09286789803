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


def test_backward_in_place(xp):
    rng = numpy.random.default_rng(1)
    y, gy = xp.asarray(rng.normal(size=(3, 2, 4))), xp.asarray(rng.normal(size=(3, 2, 4)))
    inv_std = xp.asarray(numpy.array([0.5, 2.0]))
    want = to_numpy(batch_norm_backward(gy, y, inv_std, xp.empty(gy.shape)))
    numpy.testing.assert_allclose(to_numpy(batch_norm_backward(gy, y, inv_std, gy)), want, rtol=1e-14)
