"""kernels.softmax_loss: loss sums and gradients against PyTorch's cross_entropy, with ignore_label."""
import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.kernels.softmax_loss import softmax_loss_backward, softmax_loss_forward


@pytest.mark.parametrize("outer,channels,inner", [(4, 5, 3), (6, 2, 1)])
@pytest.mark.parametrize("ignore_label", [None, 1])
def test_matches_torch(xp, outer, channels, inner, ignore_label):
    torch = pytest.importorskip("torch")
    rng = numpy.random.default_rng(0)
    logits = rng.normal(size=(outer, channels, inner)) * 2
    label = rng.integers(0, channels, (outer, inner))
    label[0, 0] = 1  # at least one ignored position when ignore_label is 1
    prob = numpy.exp(logits) / numpy.exp(logits).sum(axis=1, keepdims=True)
    loss, count = softmax_loss_forward(xp.asarray(prob), xp.asarray(label.astype(float)), outer, channels, inner,
                                       ignore_label)
    t_logits = torch.tensor(logits, requires_grad=True)
    t_loss = torch.nn.functional.cross_entropy(t_logits, torch.tensor(label), reduction="sum",
                                               ignore_index=-100 if ignore_label is None else ignore_label)
    t_loss.backward()
    want_count = label.size if ignore_label is None else int((label != ignore_label).sum())
    assert int(count) == want_count
    numpy.testing.assert_allclose(float(loss), t_loss.item(), rtol=1e-12)
    g = softmax_loss_backward(xp.asarray(prob), xp.asarray(label.astype(float)), outer, channels, inner, 0.5,
                              ignore_label)
    numpy.testing.assert_allclose(to_numpy(g), 0.5 * t_logits.grad.numpy(), rtol=1e-10, atol=1e-14)


def test_log_is_guarded(xp):
    # p = 0 at the label: -log(FLT_MIN), as Caffe, not inf
    prob = xp.asarray(numpy.array([[1.0, 0.0]]).reshape(1, 2, 1))
    loss, count = softmax_loss_forward(prob, xp.asarray(numpy.array([1.0])), 1, 2, 1)
    assert float(loss) == pytest.approx(-numpy.log(numpy.finfo(numpy.float32).tiny)) and int(count) == 1
