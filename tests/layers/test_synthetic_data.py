"""SyntheticData: balanced labels, one fixed coarse pattern per class plus noise, reproducible from the seeds,
and a net that trains on it learns (its loss falls, where DummyData's random labels only let it climb)."""
import numpy
import pytest

from layerforge import rng
from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import ConfigError
from layerforge.layers import create_layer
from layerforge.solvers import get_solver


def synthetic(xp=numpy, **param):
    param = {"batch_size": 8, "shape": [3, 12, 10], "classes": 4, **param}
    layer = create_layer({"type": "SyntheticData", "top": ["data", "label"], "synthetic_data": param},
                         dtype=numpy.float64, xp=xp)
    top = [Blob((), numpy.float64, xp), Blob((), numpy.float64, xp)]
    layer.setup([], top)
    return layer, top


def draw(layer, top):
    layer.forward([], top)
    return to_numpy(top[0].data).copy(), to_numpy(top[1].data).astype(int)


@pytest.mark.parametrize("batch, classes", [(4, 4), (8, 4), (10, 3), (3, 5), (100, 10)])
def test_every_batch_holds_the_classes_equally_often(xp, batch, classes):
    layer, top = synthetic(xp, batch_size=batch, classes=classes)
    assert top[0].shape == (batch, 3, 12, 10) and top[1].shape == (batch,)
    for _ in range(5):
        _, labels = draw(layer, top)
        counts = numpy.bincount(labels, minlength=classes)
        assert len(counts) == classes and counts.sum() == batch
        assert set(counts) <= {batch // classes, batch // classes + 1}


def test_images_are_their_class_pattern_plus_noise(xp):
    layer, top = synthetic(xp, batch_size=8, classes=2, grid=2, noise=0.5, scale=3.0)
    pattern = [layer.pattern(k) for k in range(2)]
    # grid 2 on 12x10 images: blocks of 6x5 pixels, one value per block and channel
    numpy.testing.assert_array_equal(pattern[0][:, :6, :5], numpy.broadcast_to(pattern[0][:, :1, :1], (3, 6, 5)))
    assert not numpy.allclose(pattern[0], pattern[1])
    residuals = []
    for _ in range(40):
        images, labels = draw(layer, top)
        residuals += [image - 3.0 * pattern[k] for image, k in zip(images, labels)]
    residuals = numpy.array(residuals)
    assert abs(residuals.mean()) < 0.02 and residuals.std() == pytest.approx(3.0 * 0.5, rel=0.02)


def test_patterns_follow_the_seed_and_batches_the_random_stream(xp):
    """On a device the noise comes from cuRAND seeded from the process stream: a seed repeats the batches there too."""
    a, top_a = synthetic(xp, seed=3)
    b, top_b = synthetic(xp, seed=3)
    c, _ = synthetic(xp, seed=4)
    numpy.testing.assert_array_equal(a.pattern(2), b.pattern(2))
    assert not numpy.allclose(a.pattern(2), c.pattern(2))
    rng.seed(7)
    first, second = draw(a, top_a), draw(a, top_a)
    rng.seed(7)
    again = draw(b, top_b)
    numpy.testing.assert_array_equal(first[0], again[0])
    numpy.testing.assert_array_equal(first[1], again[1])
    assert not numpy.allclose(first[0], second[0])  # and the next batch is another


@pytest.mark.parametrize("param, key, message", [
    ({"shape": [4, 3, 12, 10]}, "synthetic_data.shape", r"one image's \(C, H, W\), got 4 values"),
    ({"grid": 11}, "synthetic_data.grid", "grid 11 is larger than the images"),
    ({"classes": 0}, "synthetic_data.classes", "must be >= 1, got 0"),
])
def test_config_errors_name_the_key(param, key, message):
    with pytest.raises(ConfigError, match=message) as e:
        synthetic(**param)
    assert e.value.key == key


def classifier(data_layer, classes=1000, channels=16):
    """A small ImageNet-like classifier (a convolution of ``channels``, BatchNorm, global pooling, ``classes``
    outputs) on ``data_layer`` (a layer definition with tops ``data`` and the labels)."""
    return {"name": "small", "layers": [
        data_layer,
        {"name": "conv", "type": "Convolution", "bottom": "data", "top": "conv",
         "convolution": {"num_output": channels, "kernel_size": 3, "stride": 2, "weight_filler": {"type": "msra"}}},
        {"name": "bn", "type": "BatchNorm", "bottom": "conv", "top": "conv"},
        {"name": "relu", "type": "ReLU", "bottom": "conv", "top": "conv"},
        {"name": "pool", "type": "Pooling", "bottom": "conv", "top": "pool",
         "pooling": {"pool": "AVE", "global_pooling": True}},
        {"name": "fc", "type": "InnerProduct", "bottom": "pool", "top": "fc",
         "inner_product": {"num_output": classes, "weight_filler": {"type": "msra"}}},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["fc", data_layer["top"][1]], "top": "loss"}]}


def losses(data_layer, iterations=40):
    solver = get_solver({"net_param": classifier(data_layer), "base_lr": 0.1, "momentum": 0.9,
                         "weight_decay": 0.0001, "max_iter": iterations, "random_seed": 1, "snapshot": 0})
    out = []
    for _ in range(iterations):
        solver.step(1)
        out.append(solver.net.loss)
    return numpy.array(out)


SYNTHETIC = {"name": "data", "type": "SyntheticData", "top": ["data", "label"],
             "synthetic_data": {"batch_size": 8, "shape": [3, 24, 24], "classes": 8, "scale": 50}}
# the zoo's earlier synthetic default: gaussian images, uniformly random labels (nothing to learn)
RANDOM = {"name": "data", "type": "DummyData", "top": ["data", "label"],
          "dummy_data": {"shape": [[8, 3, 24, 24], [8]], "integer": [False, True],
                         "data_filler": [{"type": "gaussian", "std": 50}, {"type": "uniform", "min": 0, "max": 1000}]}}


def test_training_on_the_device_repeats_from_the_random_seed():
    """SyntheticData on a device (its noise drawn there): two runs from one random_seed give the same losses and
    weights, bit for bit."""
    net = classifier(SYNTHETIC, classes=8, channels=4)
    net["layers"][1]["convolution"]["engine"] = "IM2COL"  # AUTO's trials would time engines that differ in rounding
    runs = []
    for _ in range(2):
        solver = get_solver({"net_param": net, "base_lr": 0.1,
                             "max_iter": 3, "random_seed": 1, "snapshot": 0, "snapshot_after_train": False,
                             "solver_mode": "GPU"})
        solver.solve()
        runs.append(solver)
    assert runs[0].net.xp.__name__ == "cupy"
    assert list(runs[0].losses) == list(runs[1].losses)
    for a, b in zip(runs[0].net.learnable_params, runs[1].net.learnable_params):
        numpy.testing.assert_array_equal(to_numpy(a.data), to_numpy(b.data))


def test_a_net_learns_the_classes():
    learned, random = losses(SYNTHETIC), losses(RANDOM)
    assert learned[0] == pytest.approx(numpy.log(1000), rel=0.2)
    assert random[0] == pytest.approx(numpy.log(1000), rel=0.2)
    # from ln(1000): below ln(8) the net tells the 8 patterns apart, not only which 8 of 1,000 labels occur
    assert learned[-5:].mean() < 0.8 * numpy.log(8)
    assert random[-5:].mean() > 6.0  # random labels: nothing to learn
