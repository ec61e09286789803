"""ContrastiveLoss, HingeLoss, InfogainLoss, MultinomialLogisticLoss, SigmoidCrossEntropyLoss: Caffe's
formulas by hand, finite-difference gradients, and PyTorch written out op by op as the reference."""
import numpy
import pytest

from layerforge import Net
from layerforge.blob import Blob
from layerforge.errors import ConfigError, DataError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob

torch = pytest.importorskip("torch")


def make(type_, xp=numpy, bottoms=2, **blocks):
    return create_layer({"type": type_, "bottom": [f"b{i}" for i in range(bottoms)], **blocks}, dtype=numpy.float64,
                        xp=xp)


def run(layer, arrays, xp=numpy, weight=1.0):
    """Forward and backward once: (loss, [bottom diffs as numpy])."""
    bottom = [make_blob(a, xp=xp) for a in arrays]
    top = [Blob(dtype=numpy.float64, xp=xp)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    top[0].diff[...] = weight
    layer.backward(top, [True] + [False] * (len(bottom) - 1) if layer.type != "ContrastiveLoss"
                   else [True, True, False], bottom)
    return float(top[0].data), [numpy.asarray(b.diff.tolist()) for b in bottom]


RS = numpy.random.RandomState(7)


# -- ContrastiveLoss ------------------------------------------------------------------------------

def contrastive_torch(a, b, y, margin, legacy):
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    d2 = ((ta - tb) ** 2).reshape(len(a), -1).sum(1)
    far = torch.clamp(margin - d2, min=0) if legacy else torch.clamp(margin - torch.sqrt(d2), min=0) ** 2
    loss = torch.where(torch.tensor(y.reshape(-1) != 0), d2, far).sum() / (2 * len(a))
    loss.backward()
    return loss.item(), ta.grad.numpy(), tb.grad.numpy()


@pytest.mark.parametrize("legacy", [False, True])
def test_contrastive_loss_matches_the_formula(xp, legacy):
    a, b = RS.randn(6, 4, 1, 1) * 0.4, RS.randn(6, 4, 1, 1) * 0.4
    y = numpy.array([1, 0, 1, 0, 0, 1], dtype=float).reshape(6, 1, 1, 1)
    layer = make("ContrastiveLoss", xp, bottoms=3, contrastive_loss={"margin": 1.5, "legacy_version": legacy})
    loss, (ga, gb, _) = run(layer, [a, b, y], xp, weight=2.0)
    want, wa, wb = contrastive_torch(a, b, y, 1.5, legacy)
    assert loss == pytest.approx(want, rel=1e-12)
    # Caffe's dissimilar-pair gradient divides by d + 1e-4 instead of d: compare to that tolerance
    numpy.testing.assert_allclose(ga, 2 * wa, rtol=0 if legacy else 2e-3, atol=1e-12)
    numpy.testing.assert_allclose(gb, 2 * wb, rtol=0 if legacy else 2e-3, atol=1e-12)


def test_contrastive_loss_by_hand():
    # pair 1 similar: d^2 = 1 + 4 = 5; pair 2 dissimilar at d = 1 < margin 2: (2 - 1)^2 = 1
    a = numpy.array([[1.0, 2.0], [0.0, 1.0]])
    b = numpy.array([[0.0, 0.0], [0.0, 0.0]])
    loss, (ga, gb, _) = run(make("ContrastiveLoss", bottoms=3, contrastive_loss={"margin": 2.0}),
                            [a, b, numpy.array([1.0, 0.0])])
    assert loss == pytest.approx((5 + 1) / 4)
    numpy.testing.assert_allclose(ga[0], [0.5, 1.0])
    numpy.testing.assert_allclose(ga[1], [0.0, -(2 - 1) / (1 + 1e-4) / 2])
    numpy.testing.assert_allclose(gb, -ga)


@pytest.mark.parametrize("legacy", [False, True])
def test_contrastive_gradient_check(legacy):
    a, b = RS.randn(5, 3) * 0.3, RS.randn(5, 3) * 0.3
    y = numpy.array([1, 0, 0, 1, 0], dtype=float)
    layer = make("ContrastiveLoss", bottoms=3, contrastive_loss={"margin": 1.0, "legacy_version": legacy})
    # the analytic gradient uses d + 1e-4 (Caffe): a looser threshold than the default
    check_gradient(layer, [make_blob(a), make_blob(b), make_blob(y)], [Blob()], check_bottom=[0, 1],
                   threshold=2e-3 if not legacy else 1e-3)


# -- HingeLoss ------------------------------------------------------------------------------------

@pytest.mark.parametrize("norm", ["L1", "L2"])
def test_hinge_loss_matches_the_formula(xp, norm):
    x, label = RS.randn(5, 4) * 1.5, numpy.array([0, 3, 1, 1, 2], dtype=float)
    loss, (gx, _) = run(make("HingeLoss", xp, hinge_loss={"norm": norm}), [x, label], xp, weight=0.5)
    t = torch.tensor(x, requires_grad=True)
    delta = torch.where(torch.arange(4)[None, :] == torch.tensor(label, dtype=torch.long)[:, None], 1.0, -1.0)
    m = torch.clamp(1 - delta * t, min=0)
    ref = (m if norm == "L1" else m ** 2).sum() / 5
    (0.5 * ref).backward()
    assert loss == pytest.approx(ref.item(), rel=1e-12)
    numpy.testing.assert_allclose(gx, t.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_hinge_gradient_check():
    x = RS.uniform(-3, 3, (4, 5))
    x[numpy.abs(numpy.abs(x) - 1) < 0.1] = 0.3  # away from the hinge's kinks at |x| = 1
    check_gradient(make("HingeLoss", hinge_loss={"norm": "L2"}), [make_blob(x), make_blob([0.0, 4, 2, 1])],
                   [Blob()], check_bottom=[0])
    check_gradient(make("HingeLoss"), [make_blob(x), make_blob([0.0, 4, 2, 1])], [Blob()], check_bottom=[0])


# -- InfogainLoss ---------------------------------------------------------------------------------

def test_infogain_with_identity_is_softmax_loss(xp):
    x, label = RS.randn(6, 5), RS.randint(5, size=6).astype(float)
    info, (gi, _, _) = run(make("InfogainLoss", xp, bottoms=3), [x, label, numpy.eye(5)], xp)
    soft, (gs, _) = run(make("SoftmaxWithLoss", xp), [x, label], xp)
    assert info == pytest.approx(soft, rel=1e-12)
    numpy.testing.assert_allclose(gi, gs, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("axis,shape", [(1, (4, 3)), (1, (2, 3, 2, 2)), (2, (2, 2, 3))])
def test_infogain_matches_the_formula_and_gradients(axis, shape):
    x = RS.randn(*shape)
    channels = shape[axis]
    n_labels = int(numpy.prod(shape)) // channels
    label = RS.randint(channels, size=n_labels).astype(float)
    h = RS.rand(channels, channels)
    layer = make("InfogainLoss", bottoms=3, infogain_loss={"axis": axis})
    loss, (gx, _, _) = run(layer, [x, label, h])
    t = torch.tensor(x, requires_grad=True)
    logp = torch.log_softmax(t, dim=axis).movedim(axis, -1).reshape(-1, channels)
    ref = -(torch.tensor(h)[torch.tensor(label, dtype=torch.long)] * logp).sum() / n_labels
    ref.backward()
    assert loss == pytest.approx(ref.item(), rel=1e-12)
    numpy.testing.assert_allclose(gx, t.grad.numpy(), rtol=1e-10, atol=1e-14)
    check_gradient(make("InfogainLoss", bottoms=3, infogain_loss={"axis": axis}),
                   [make_blob(x), make_blob(label), make_blob(h)], [Blob()], check_bottom=[0])


def test_infogain_matrix_from_a_file_and_ignore_label(tmp_path):
    h = numpy.array([[2.0, 0.5], [0.0, 1.0]])
    numpy.save(tmp_path / "h.npy", h)
    x, label = numpy.array([[1.0, -1.0], [0.5, 0.5], [2.0, 0.0]]), numpy.array([0.0, 1.0, 1.0])
    layer = make("InfogainLoss", infogain_loss={"source": str(tmp_path / "h.npy")}, loss={"ignore_label": 1})
    loss, _ = run(layer, [x, label])
    p = numpy.exp(x[0]) / numpy.exp(x[0]).sum()
    assert loss == pytest.approx(-(2.0 * numpy.log(p[0]) + 0.5 * numpy.log(p[1])))  # one valid position
    with pytest.raises(ConfigError, match="needs the H matrix"):
        make("InfogainLoss")


def test_infogain_matrix_from_caffes_binaryproto(tmp_path):
    from layerforge.caffe.blobproto import write_blobproto

    h = numpy.array([[2.0, 0.5], [0.0, 1.0]])
    write_blobproto(tmp_path / "h.binaryproto", h.reshape(1, 1, 2, 2))  # Caffe's tools write 1 x 1 x C x C
    x, label = numpy.array([[1.0, -1.0]]), numpy.array([0.0])
    loss, _ = run(make("InfogainLoss", infogain_loss={"source": str(tmp_path / "h.binaryproto")}), [x, label])
    p = numpy.exp(x[0]) / numpy.exp(x[0]).sum()
    assert loss == pytest.approx(-(2.0 * numpy.log(p[0]) + 0.5 * numpy.log(p[1])), rel=1e-6)


@pytest.mark.parametrize("blocks,key,message", [
    ({"infogain_loss": {"source": "h.npy"}, "loss": {"normalize": True}}, "loss.normalize",
     "normalize is deprecated"),
])
def test_infogain_refuses_what_it_cannot_honour(blocks, key, message):
    with pytest.raises(ConfigError, match=message) as e:
        make("InfogainLoss", **blocks)
    assert e.value.key == key and "\n" not in str(e.value)


def test_infogain_clamps_probabilities_at_caffes_log_threshold():
    # p[0, 1] = softmax([0, -100])[1] ~ 3.7e-44 is clamped at 1e-20 (kLOG_THRESHOLD, not FLT_MIN)
    h = numpy.array([[0.0, 1.0], [0.0, 1.0]])
    loss, _ = run(make("InfogainLoss", bottoms=3), [numpy.array([[0.0, -100.0]]), numpy.array([0.0]), h])
    assert loss == pytest.approx(-numpy.log(1e-20))


def test_fractional_labels_truncate_as_caffes_int_cast():
    # SigmoidCrossEntropyLoss ignores a target of -1.5 with ignore_label -1; ContrastiveLoss reads y = 0.7 as 0
    x = numpy.array([[2.0, -1.0]])
    loss, (gx, _) = run(make("SigmoidCrossEntropyLoss", loss={"ignore_label": -1}), [x, numpy.array([[-1.5, 1.0]])])
    assert loss == pytest.approx(numpy.log1p(numpy.exp(1.0)))
    assert gx[0, 0] == 0
    a, b = numpy.array([[0.5]]), numpy.array([[0.0]])
    loss, _ = run(make("ContrastiveLoss", bottoms=3), [a, b, numpy.array([0.7])])
    assert loss == pytest.approx((1 - 0.5) ** 2 / 2)  # dissimilar: max(margin 1 - d, 0)^2 / 2N


# -- MultinomialLogisticLoss ----------------------------------------------------------------------

def test_multinomial_logistic_loss_matches_nll(xp):
    logits = RS.randn(5, 4)
    p = numpy.exp(logits) / numpy.exp(logits).sum(1, keepdims=True)
    label = numpy.array([0, 3, 1, 1, 2], dtype=float)
    loss, (gp, _) = run(make("MultinomialLogisticLoss", xp), [p.reshape(5, 4, 1, 1), label], xp, weight=3.0)
    t = torch.tensor(p, requires_grad=True)
    ref = torch.nn.functional.nll_loss(torch.log(t), torch.tensor(label, dtype=torch.long))
    (3.0 * ref).backward()
    assert loss == pytest.approx(ref.item(), rel=1e-12)
    numpy.testing.assert_allclose(gp.reshape(5, 4), t.grad.numpy(), rtol=1e-12)


def test_multinomial_logistic_loss_clamps_zero_probabilities():
    loss, (gp, _) = run(make("MultinomialLogisticLoss"), [numpy.array([[0.0, 1.0]]), numpy.array([0.0])])
    assert loss == pytest.approx(-numpy.log(1e-20))
    assert gp[0, 0] == pytest.approx(-1e20)
    p = RS.uniform(0.2, 0.8, (3, 4))
    check_gradient(make("MultinomialLogisticLoss"), [make_blob(p), make_blob([1.0, 0, 3])], [Blob()],
                   check_bottom=[0], stepsize=1e-4)


def test_label_out_of_range_is_one_line():
    with pytest.raises(DataError, match=r"label 4 at index \(1,\) of the label blob is outside \[0, 4\)"):
        run(make("MultinomialLogisticLoss"), [numpy.full((2, 4), 0.25), numpy.array([1.0, 4.0])])


# -- SigmoidCrossEntropyLoss ----------------------------------------------------------------------

@pytest.mark.parametrize("normalization,divisor", [("VALID", 9), ("FULL", 12), ("BATCH_SIZE", 3), ("NONE", 1)])
def test_sigmoid_cross_entropy_with_ignore_label(xp, normalization, divisor):
    x = RS.randn(3, 4) * 3
    t = (RS.rand(3, 4) > 0.5).astype(float)
    t[0, :3] = -1  # ignored: 9 valid positions
    layer = make("SigmoidCrossEntropyLoss", xp, loss={"ignore_label": -1, "normalization": normalization})
    loss, (gx, _) = run(layer, [x, t], xp)
    tt = torch.tensor(x, requires_grad=True)
    mask = torch.tensor(t != -1)
    per = torch.nn.functional.binary_cross_entropy_with_logits(tt, torch.tensor(t).clamp(min=0), reduction="none")
    ref = (per * mask).sum() / divisor
    ref.backward()
    assert loss == pytest.approx(ref.item(), rel=1e-12)
    numpy.testing.assert_allclose(gx, tt.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_sigmoid_cross_entropy_is_finite_for_large_scores_and_gradient_checks():
    loss, (gx, _) = run(make("SigmoidCrossEntropyLoss"), [numpy.array([[1000.0, -1000.0]]), numpy.array([[0.0, 1.0]])])
    assert loss == pytest.approx(2000.0)  # default BATCH_SIZE (1 item): two terms of -log(sigmoid(-1000)) = 1000
    numpy.testing.assert_allclose(gx, [[1.0, -1.0]])
    x, t = RS.randn(2, 3, 2), RS.rand(2, 3, 2)
    check_gradient(make("SigmoidCrossEntropyLoss"), [make_blob(x), make_blob(t)], [Blob()], check_bottom=[0])


def test_losses_from_a_v1_prototxt(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text("""name: "losses"
input: "a" input_dim: 4 input_dim: 3 input_dim: 1 input_dim: 1
input: "b" input_dim: 4 input_dim: 3 input_dim: 1 input_dim: 1
input: "y" input_dim: 4 input_dim: 1 input_dim: 1 input_dim: 1
layers { name: "c" type: CONTRASTIVE_LOSS bottom: "a" bottom: "b" bottom: "y" top: "c"
  contrastive_loss_param { margin: 2 } }
layers { name: "h" type: HINGE_LOSS bottom: "a" bottom: "y" top: "h" hinge_loss_param { norm: L2 } }
layers { name: "s" type: SIGMOID_CROSS_ENTROPY_LOSS bottom: "b" bottom: "a" top: "s" loss_weight: 0.5 }
""")
    net = Net(str(path), phase="train", dtype="float64")
    a, b, y = RS.randn(4, 3, 1, 1), RS.rand(4, 3, 1, 1), numpy.array([1.0, 0, 2, 1]).reshape(4, 1, 1, 1)
    out = net.forward(a=a, b=b, y=y)
    assert set(out) == {"c", "h", "s"}
    assert net.loss == pytest.approx(float(out["c"]) + float(out["h"]) + 0.5 * float(out["s"]))


@pytest.mark.parametrize("type_,bottoms,gradients", [
    ("ContrastiveLoss", 3, [True, True, False]), ("HingeLoss", 2, [True, False]),
    ("InfogainLoss", 3, [True, False, False]), ("MultinomialLogisticLoss", 2, [True, False]),
    ("SigmoidCrossEntropyLoss", 2, [True, False]), ("EuclideanLoss", 2, [True, True]),
])
def test_label_bottoms_take_no_gradient(type_, bottoms, gradients):
    layer = make(type_, bottoms=bottoms)
    assert layer.default_loss_weight == 1.0
    assert [layer.allow_force_backward(i) for i in range(bottoms)] == gradients
    if not all(gradients):
        with pytest.raises(ConfigError, match="cannot backpropagate to the labels"):
            layer.backward([Blob()], [True] * bottoms, [Blob()] * bottoms)


def test_infogain_and_multinomial_from_prototxt(tmp_path):
    h = numpy.array([[1.0, 0.5, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 1.0]])
    numpy.save(tmp_path / "h.npy", h)
    for version, (info, multi) in {"v2": ('type: "InfogainLoss"', 'type: "MultinomialLogisticLoss"'),
                                   "v1": ("type: INFOGAIN_LOSS", "type: MULTINOMIAL_LOGISTIC_LOSS")}.items():
        kind, prob = ("layer", 'type: "Softmax"') if version == "v2" else ("layers", "type: SOFTMAX")
        path = tmp_path / f"{version}.prototxt"
        path.write_text(f"""name: "{version}"
input: "x" input_dim: 2 input_dim: 3 input_dim: 1 input_dim: 1
input: "label" input_dim: 2 input_dim: 1 input_dim: 1 input_dim: 1
{kind} {{ name: "info" {info} bottom: "x" bottom: "label" top: "info"
  infogain_loss_param {{ source: "{tmp_path / 'h.npy'}" }} }}
{kind} {{ name: "prob" {prob} bottom: "x" top: "prob" }}
{kind} {{ name: "multi" {multi} bottom: "prob" bottom: "label" top: "multi" }}
""")
        net = Net(str(path), phase="train", dtype="float64")
        x, label = numpy.array([[1.0, 0.0, -1.0], [0.5, 2.0, 0.0]]), numpy.array([0.0, 1.0])
        out = net.forward(x=x.reshape(2, 3, 1, 1), label=label.reshape(2, 1, 1, 1))
        logp = x - numpy.log(numpy.exp(x).sum(1, keepdims=True))
        assert float(out["info"]) == pytest.approx(-(h[[0, 1]] * logp).sum() / 2, rel=1e-12)
        assert float(out["multi"]) == pytest.approx(-logp[[0, 1], [0, 1]].sum() / 2, rel=1e-12)
