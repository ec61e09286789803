"""PriorBox (SSD's fork) on the vectors of the fork's test_prior_box_layer.cpp: a 10x10 map of a 100x100 image,
min_size 4, max_size 9."""
import math

import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import ConfigError
from layerforge.layers import create_layer

R2 = math.sqrt(2)


def priors(block, xp=numpy, map_shape=(10, 10, 10, 10), image_shape=(10, 3, 100, 100), dtype=numpy.float32):
    block = dict({"min_size": [4], "max_size": [9]}, **block)
    layer = create_layer({"type": "PriorBox", "bottom": ["f", "d"], "top": "p", "prior_box": block}, dtype=dtype, xp=xp)
    bottom = [Blob(map_shape, dtype, xp), Blob(image_shape, dtype, xp)]
    top = Blob((), dtype, xp)
    layer.setup(bottom, top=[top])
    layer.forward(bottom, [top])
    return to_numpy(top.data)


@pytest.mark.parametrize("block, per_cell", [
    ({}, 2), ({"min_size": [4, 14], "max_size": [9, 19]}, 4), ({"max_size": []}, 1),
    ({"min_size": [4, 14], "max_size": []}, 2), ({"aspect_ratio": [1, 2], "flip": False}, 3),
    ({"aspect_ratio": [2, 3], "flip": False}, 4), ({"aspect_ratio": [2, 3]}, 6),
    ({"min_size": [4, 14], "max_size": [9, 19], "aspect_ratio": [2, 3]}, 12),
    ({"aspect_ratio": [2, 0.5, 2]}, 4),  # repeats (1 / 2 with flip) are dropped
])
def test_setup_shapes(block, per_cell):
    assert priors(block).shape == (1, 2, 100 * per_cell * 4)


def near(top, index, values, eps=1e-6):
    numpy.testing.assert_allclose(top[0, 0, index:index + 4], values, atol=eps)


def test_cpu(xp):
    top = priors({}, xp)
    near(top, 0, [0.03, 0.03, 0.07, 0.07])
    near(top, 4, [0.02, 0.02, 0.08, 0.08])
    near(top, 4 * 10 * 2 * 4 + 4 * 2 * 4, [0.43, 0.43, 0.47, 0.47])
    numpy.testing.assert_allclose(top[0, 1], 0.1, atol=1e-6)


def test_cpu_no_max_size(xp):
    top = priors({"max_size": []}, xp)
    near(top, 0, [0.03, 0.03, 0.07, 0.07])
    near(top, 4 * 10 * 1 * 4 + 4 * 1 * 4, [0.43, 0.43, 0.47, 0.47])


@pytest.mark.parametrize("variance, expected", [([1.0], [1.0] * 4), ([0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4])])
def test_cpu_variances(xp, variance, expected):
    top = priors({"variance": variance}, xp)
    near(top, 4, [0.02, 0.02, 0.08, 0.08])
    numpy.testing.assert_allclose(top[0, 1].reshape(-1, 4), numpy.tile(expected, (200, 1)), atol=1e-6)


def test_cpu_aspect_ratio_no_flip(xp):
    top = priors({"aspect_ratio": [2], "flip": False}, xp)
    near(top, 8, [0.05 - 0.02 * R2, 0.05 - 0.01 * R2, 0.05 + 0.02 * R2, 0.05 + 0.01 * R2])
    cell = 4 * 10 * 3 * 4 + 4 * 3 * 4
    near(top, cell, [0.43, 0.43, 0.47, 0.47])
    near(top, cell + 8, [0.45 - 0.02 * R2, 0.45 - 0.01 * R2, 0.45 + 0.02 * R2, 0.45 + 0.01 * R2])


def test_cpu_aspect_ratio(xp):
    top = priors({"aspect_ratio": [2]}, xp)
    near(top, 8, [0.05 - 0.02 * R2, 0.05 - 0.01 * R2, 0.05 + 0.02 * R2, 0.05 + 0.01 * R2])
    near(top, 12, [0.05 - 0.01 * R2, 0.05 - 0.02 * R2, 0.05 + 0.01 * R2, 0.05 + 0.02 * R2])
    cell = 4 * 10 * 4 * 4 + 4 * 4 * 4
    near(top, cell + 12, [0.45 - 0.01 * R2, 0.45 - 0.02 * R2, 0.45 + 0.01 * R2, 0.45 + 0.02 * R2])


def test_cpu_aspect_ratio_multi_size_clipped(xp):
    top = priors({"min_size": [4, 8], "max_size": [9, 18], "aspect_ratio": [2], "clip": True}, xp)
    near(top, 0, [0.03, 0.03, 0.07, 0.07])
    near(top, 16, [0.01, 0.01, 0.09, 0.09])
    near(top, 20, [0.0, 0.0, 0.11, 0.11])
    near(top, 24, [0.0, 0.05 - 0.04 / R2, 0.05 + 0.04 * R2, 0.05 + 0.04 / R2])
    near(top, 28, [0.05 - 0.04 / R2, 0.0, 0.05 + 0.04 / R2, 0.05 + 0.04 * R2])
    near(top, 8 * 10 * 4 * 4 + 8 * 4 * 4, [0.43, 0.43, 0.47, 0.47])


def test_cpu_fixed_step(xp):
    # a 20x10 map of a 200x100 image, but img_size 100 and step 10: rows past 10 leave the "image"
    top = priors({"aspect_ratio": [2], "img_size": 100, "step": 10}, xp, map_shape=(10, 10, 20, 10),
                 image_shape=(10, 3, 200, 100))
    cell = 14 * 10 * 4 * 4 + 4 * 4 * 4
    near(top, cell, [0.43, 1.43, 0.47, 1.47])
    near(top, cell + 8, [0.45 - 0.02 * R2, 1.45 - 0.01 * R2, 0.45 + 0.02 * R2, 1.45 + 0.01 * R2])
    near(top, cell + 12, [0.45 - 0.01 * R2, 1.45 - 0.02 * R2, 0.45 + 0.01 * R2, 1.45 + 0.02 * R2])


def test_steps_and_image_size_per_axis():
    top = priors({"max_size": [], "img_h": 50, "img_w": 100, "step_h": 5, "step_w": 10, "offset": 0.0})
    near(top, 10 * 4, [-0.02, 5 / 50 - 0.04, 0.02, 5 / 50 + 0.04])  # cell (1, 0): centre (0, 5) pixels


def test_min_size_is_truncated_to_pixels_as_the_fork_does():
    numpy.testing.assert_allclose(priors({"min_size": [4.9], "max_size": []})[0, 0, :4], [0.03, 0.03, 0.07, 0.07],
                                  atol=1e-6)


@pytest.mark.parametrize("block, message", [
    ({"min_size": []}, "give one or more min_size"),
    ({"max_size": [9, 10]}, "gives 2 max_size for 1 min_size"),
    ({"max_size": [3]}, "must be greater than its min_size"),
    ({"variance": [0.1, 0.2]}, "one or four positive variances"),
    ({"img_size": 100, "img_h": 100, "img_w": 100}, "either img_size or img_h/img_w"),
    ({"step_h": 8}, "give both step_h and step_w"),
])
def test_bad_parameters(block, message):
    with pytest.raises(ConfigError, match=message):
        priors(block)


def test_opencvs_offsets_place_each_box_at_each_offset(xp):
    # TextBoxes' fork: every box also half a cell lower; OpenCV writes it offset_w [0.5, 0.5], offset_h [0.5, 1.0]
    top = priors({"max_size": [], "offset_w": [0.5, 0.5], "offset_h": [0.5, 1.0]}, xp)
    assert top.shape == (1, 2, 100 * 2 * 4)
    near(top, 0, [0.03, 0.03, 0.07, 0.07])
    near(top, 4, [0.03, 0.08, 0.07, 0.12])
    near(top, (4 * 10 + 4) * 2 * 4 + 4, [0.43, 0.48, 0.47, 0.52])


def test_opencvs_explicit_box_sizes(xp):
    top = priors({"min_size": [], "max_size": [], "width": [4, 8], "height": [6, 2]}, xp)
    near(top, 0, [0.03, 0.02, 0.07, 0.08])
    near(top, 4, [0.01, 0.04, 0.09, 0.06])


@pytest.mark.parametrize("block, message", [
    ({"width": [4], "height": []}, "gives 1 width for 0 height"),
    ({"width": [4], "height": [4]}, "width and height, or min_size"),
    ({"offset_h": [0.5, 1.0], "offset_w": [0.5]}, "as many offset_w as offset_h"),
    ({"offset_h": [0.5], "offset_w": [0.5], "offset": 0.5}, "as many offset_w as offset_h"),
])
def test_bad_opencv_fields(block, message):
    with pytest.raises(ConfigError, match=message):
        priors(block)
