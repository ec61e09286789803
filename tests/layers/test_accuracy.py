import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import DataError, ShapeError
from layerforge.layers import create_layer
from layerforge.testing import make_blob


def accuracy(xp=numpy, **block):
    return create_layer({"type": "Accuracy", "accuracy": block}, phase="TEST", dtype=numpy.float64, xp=xp)


def run(layer, x, label, xp=numpy, n_top=2):
    bottom = []
    for a in (x, label):
        a = numpy.asarray(a, dtype=numpy.float64)
        b = Blob(a.shape, numpy.float64, xp)
        b.data[...] = xp.asarray(a)
        bottom.append(b)
    top = [Blob((), numpy.float64, xp) for _ in range(n_top)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return [to_numpy(t.data) for t in top]


def caffe_reference(x, label, top_k, axis=1, ignore_label=None):
    """Caffe's AccuracyLayer::Forward_cpu loop, transcribed."""
    outer, c = int(numpy.prod(x.shape[:axis])), x.shape[axis]
    x = x.reshape(outer, c, -1)
    label = label.reshape(outer, -1).astype(int)
    hits, count, per_hit, per_num = 0, 0, numpy.zeros(c), numpy.zeros(c)
    for i, j in numpy.ndindex(label.shape):
        k = label[i, j]
        if ignore_label is not None and k == ignore_label:
            continue
        per_num[k] += 1
        better = -1  # the true class counts itself
        for m in range(c):
            better += x[i, m, j] >= x[i, k, j]
        if better < top_k:
            hits += 1
            per_hit[k] += 1
        count += 1
    per_class = numpy.where(per_num > 0, per_hit / numpy.maximum(per_num, 1), 0)
    return (hits / count if count else 0.0), per_class


def test_hand_computed_top1_top2(xp):
    x = [[0.1, 0.7, 0.2],   # label 1: best                  -> top-1 and top-2 hit
         [0.5, 0.3, 0.2],   # label 1: second                -> top-2 hit only
         [0.5, 0.3, 0.2],   # label 2: third                 -> miss
         [0.4, 0.4, 0.2]]   # label 0: tied with class 1     -> Caffe counts the tie against: top-2 hit only
    label = [1, 1, 2, 0]
    acc, per_class = run(accuracy(xp), x, label, xp)
    assert acc.shape == () and float(acc) == pytest.approx(1 / 4)
    numpy.testing.assert_allclose(per_class, [0.0, 0.5, 0.0])
    acc, per_class = run(accuracy(xp, top_k=2), x, label, xp)
    assert float(acc) == pytest.approx(3 / 4)
    numpy.testing.assert_allclose(per_class, [1.0, 1.0, 0.0])


def test_ignore_label_and_empty_classes():
    x = [[0.9, 0.1, 0.0], [0.2, 0.8, 0.0], [0.2, 0.8, 0.0]]
    acc, per_class = run(accuracy(ignore_label=-1), x, [0, -1, 0])
    assert float(acc) == pytest.approx(1 / 2)
    numpy.testing.assert_allclose(per_class, [0.5, 0.0, 0.0])  # classes 1 and 2 have no labels -> 0
    acc, per_class = run(accuracy(ignore_label=-1), x, [-1, -1, -1])
    assert float(acc) == 0.0
    numpy.testing.assert_array_equal(per_class, 0.0)


@pytest.mark.parametrize("shape,axis,label_shape", [((20, 5), 1, (20,)), ((4, 5, 3, 2), 1, (4, 1, 3, 2)),
                                                    ((3, 4, 6), -1, (3, 4)), ((5, 4, 3), 0, (4, 3))])
@pytest.mark.parametrize("top_k", [1, 3])
@pytest.mark.parametrize("ignore_label", [None, 2])
def test_matches_caffe_loop(shape, axis, label_shape, top_k, ignore_label):
    rs = numpy.random.default_rng(0)
    x = rs.integers(0, 3, shape).astype(float)  # few distinct values: many ties
    label = rs.integers(0, shape[axis], label_shape).astype(float)
    block = {} if ignore_label is None else {"ignore_label": ignore_label}
    acc, per_class = run(accuracy(top_k=top_k, axis=axis, **block), x, label)
    want_acc, want_per_class = caffe_reference(x, label, top_k, axis % len(shape), ignore_label)
    assert float(acc) == pytest.approx(want_acc, rel=1e-14)
    numpy.testing.assert_allclose(per_class, want_per_class, rtol=1e-14)


def test_one_top_only():
    (acc,) = run(accuracy(), [[1.0, 0.0], [0.0, 1.0]], [0, 0], n_top=1)
    assert float(acc) == 0.5


def test_no_backward():
    layer = accuracy()
    assert layer.has_backward is False
    assert not layer.allow_force_backward(0) and not layer.allow_force_backward(1)


def test_errors():
    with pytest.raises(ShapeError, match="top_k 4 exceeds the 3 classes"):
        run(accuracy(top_k=4), numpy.zeros((2, 3)), [0, 1])
    with pytest.raises(ShapeError, match=r"\(3,\).*must number 2.*\(2, 3\)"):
        run(accuracy(), numpy.zeros((2, 3)), [0, 1, 2])
    with pytest.raises(DataError, match=r"layer 'accuracy' \(Accuracy\): label 5"):
        run(accuracy(), numpy.zeros((2, 3)), [0, 5])


def test_float32():
    layer = create_layer({"type": "Accuracy"})
    bottom, top = [make_blob([[0.0, 1.0]], numpy.float32), make_blob([1], numpy.float32)], [Blob()]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    assert top[0].data.dtype == numpy.float32 and float(top[0].data) == 1.0
