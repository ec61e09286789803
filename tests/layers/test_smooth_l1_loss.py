"""SmoothL1Loss (the Fast R-CNN and SSD forks'): against PyTorch's smooth_l1_loss, the fork's gradient test,
and the weights' roles."""
import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import ConfigError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob


def smooth_l1(xp=numpy, sigma=None, loss_weight=None, bottoms=4):
    lp = {"type": "SmoothL1Loss", "name": "loss", "bottom": ["a", "b", "w_in", "w_out"][:bottoms], "top": "loss"}
    if sigma is not None:
        lp["smooth_l1_loss"] = {"sigma": sigma}
    if loss_weight is not None:
        lp["loss_weight"] = loss_weight
    return create_layer(lp, dtype=numpy.float64, xp=xp)


def values(shape, bottoms, seed=0):
    """Gaussian predictions, targets and weights (the fork's test fills all four with a gaussian filler)."""
    g = numpy.random.default_rng(seed)
    return [g.standard_normal(shape) for _ in range(bottoms)]


def forward_backward(layer, arrays, xp=numpy, loss_weight=1.0):
    bottom, top = [make_blob(a, xp=xp) for a in arrays], [Blob(dtype=numpy.float64, xp=xp)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    top[0].diff[...] = loss_weight
    layer.backward(top, [True, True] + [False] * (len(arrays) - 2), bottom)
    return float(to_numpy(top[0].data)), [to_numpy(b.diff) for b in bottom[:2]]


@pytest.mark.parametrize("bottoms", [2, 3, 4])
@pytest.mark.parametrize("sigma", [1.0, 3.0])
@pytest.mark.parametrize("shape", [(10, 5), (4, 8, 3, 2)])
def test_matches_torch_smooth_l1(xp, bottoms, sigma, shape):
    torch = pytest.importorskip("torch")
    arrays = values(shape, bottoms)
    loss, (da, db) = forward_backward(smooth_l1(xp, sigma, bottoms=bottoms), arrays, xp, loss_weight=3.7)
    ta, tb = (torch.tensor(v, requires_grad=True) for v in arrays[:2])
    w_in = torch.tensor(arrays[2]) if bottoms > 2 else 1.0
    w_out = torch.tensor(arrays[3]) if bottoms > 3 else 1.0
    errors = torch.nn.functional.smooth_l1_loss(w_in * ta, w_in * tb, reduction="none", beta=1 / sigma ** 2)
    want = (w_out * errors).sum() / shape[0]
    (3.7 * want).backward()
    assert loss == pytest.approx(want.item(), rel=1e-12)
    numpy.testing.assert_allclose(da, ta.grad.numpy(), rtol=1e-10, atol=1e-14)
    numpy.testing.assert_allclose(db, tb.grad.numpy(), rtol=1e-10, atol=1e-14)


def test_the_forks_gradient_test():
    # test_smooth_L1_loss_layer.cpp: (10, 5, 1, 1) gaussian bottoms, sigma 2.4, loss weight 3.7, checked on a and b
    arrays = values((10, 5, 1, 1), 4, seed=1701)
    check_gradient(smooth_l1(sigma=2.4, loss_weight=3.7), [make_blob(a) for a in arrays], [Blob()],
                   check_bottom=[0, 1])


def test_values_at_both_sides_of_the_kink():
    # sigma 2: quadratic below |x| = 0.25; 0.5 * 4 * 0.2^2 = 0.08 and 1.0 - 0.5 / 4 = 0.875, over N = 2
    loss, (da, _) = forward_backward(smooth_l1(sigma=2.0, bottoms=2), [numpy.array([[0.2], [-1.0]]), numpy.zeros((2, 1))])
    assert loss == pytest.approx((0.08 + 0.875) / 2)
    numpy.testing.assert_allclose(da, [[4 * 0.2 / 2], [-1 / 2]])


def test_zero_outside_weights_remove_a_box_from_loss_and_gradient():
    a, b = numpy.full((2, 4), 3.0), numpy.zeros((2, 4))
    w_in, w_out = numpy.ones((2, 4)), numpy.array([[1.0] * 4, [0.0] * 4])  # py-faster-rcnn: background rois
    loss, (da, db) = forward_backward(smooth_l1(), [a, b, w_in, w_out])
    assert loss == pytest.approx(4 * 2.5 / 2)
    numpy.testing.assert_array_equal(da[1], 0)
    numpy.testing.assert_array_equal(db, -da)


def test_weights_take_no_gradient_and_shapes_must_agree():
    layer = smooth_l1()
    bottom = [make_blob(v) for v in values((3, 4), 4)]
    top = [Blob()]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    with pytest.raises(ConfigError, match="cannot backpropagate to the labels"):
        layer.backward(top, [True, False, True, False], bottom)
    with pytest.raises(Exception, match=r"bottom 2 has shape \(3, 5\)"):
        smooth_l1().setup([make_blob(numpy.zeros(s)) for s in ((3, 4), (3, 4), (3, 5), (3, 4))], [Blob()])
    with pytest.raises(ConfigError, match="smooth_l1_loss.sigma"):
        smooth_l1(sigma=0.0)
