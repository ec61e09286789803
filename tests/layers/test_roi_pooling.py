"""ROIPooling (Fast R-CNN's fork): a loop reference written from the fork's formula, its C rounding, the fork's
test_roi_pooling_layer.cpp gradient case. (tests/caffe/test_fork_models.py compares it with OpenCV's.)"""
import math

import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import ConfigError, DataError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob

# the fork's test regions on a (4, 3, 12, 8) map
ROIS = [[0, 1, 1, 6, 6], [2, 6, 2, 7, 11], [1, 3, 1, 5, 10], [0, 3, 3, 3, 3]]


def roi_pooling(xp=numpy, pooled=(6, 6), scale=1.0):
    return create_layer({"type": "ROIPooling", "bottom": ["x", "rois"], "top": "y",
                         "roi_pooling": {"pooled_h": pooled[0], "pooled_w": pooled[1], "spatial_scale": scale}},
                        dtype=numpy.float64, xp=xp)


def reference(x, rois, pooled, scale):
    """The fork's Forward_cpu, loop by loop."""
    ph_n, pw_n = pooled
    out = numpy.zeros((len(rois), x.shape[1], ph_n, pw_n))
    for r, (n, *corners) in enumerate(rois):
        x1, y1, x2, y2 = (int(math.floor(abs(v * scale) + 0.5) * math.copysign(1, v * scale)) for v in corners)
        bin_h, bin_w = max(y2 - y1 + 1, 1) / ph_n, max(x2 - x1 + 1, 1) / pw_n
        for i in range(ph_n):
            for j in range(pw_n):
                h0 = min(max(math.floor(i * bin_h) + y1, 0), x.shape[2])
                h1 = min(max(math.ceil((i + 1) * bin_h) + y1, 0), x.shape[2])
                w0 = min(max(math.floor(j * bin_w) + x1, 0), x.shape[3])
                w1 = min(max(math.ceil((j + 1) * bin_w) + x1, 0), x.shape[3])
                if h1 > h0 and w1 > w0:
                    out[r, :, i, j] = x[int(n), :, h0:h1, w0:w1].max(axis=(1, 2))
    return out


def run(x, rois, xp=numpy, pooled=(6, 6), scale=1.0):
    layer = roi_pooling(xp, pooled, scale)
    bottom, top = [make_blob(x, xp=xp), make_blob(rois, xp=xp)], Blob((), numpy.float64, xp)
    layer.setup(bottom, [top])
    layer.forward(bottom, [top])
    return layer, bottom, top


@pytest.mark.parametrize("pooled, scale, rois", [
    ((6, 6), 1.0, ROIS), ((2, 3), 1.0, ROIS), ((3, 3), 0.5, [[1, 2, 4, 14, 22], [3, -4, -2, 3, 30]]),
    ((2, 2), 0.25, [[0, 2, 2, 20, 30], [1, 6, 10, 18, 46]]),  # 0.5 and 2.5 pixels: C rounds halves away from 0
])
def test_matches_the_loop_reference(xp, pooled, scale, rois):
    x = numpy.random.default_rng(0).standard_normal((4, 3, 12, 8)) * 10
    _, _, top = run(x, numpy.array(rois, dtype=float).reshape(-1, 5, 1, 1), xp, pooled, scale)
    numpy.testing.assert_array_equal(to_numpy(top.data), reference(x, rois, pooled, scale))


def test_halves_round_away_from_zero():
    # x1 = 2 * 0.25 = 0.5 rounds to 1 (numpy's round would give 0): column 0 is outside the region
    x = numpy.zeros((1, 1, 4, 4))
    x[0, 0, :, 0] = 5.0
    _, _, top = run(x, numpy.array([[0, 2, 0, 12, 12]], dtype=float), pooled=(1, 1), scale=0.25)
    assert top.data.item() == 0.0


def test_gradient_the_forks_case():
    x = make_blob(numpy.random.default_rng(1701).standard_normal((4, 3, 12, 8)) * 10)
    rois = make_blob(numpy.array(ROIS, dtype=float).reshape(4, 5, 1, 1))
    assert check_gradient(roi_pooling(), [x, rois], [Blob((), numpy.float64)], check_bottom=[0], stepsize=1e-4,
                          threshold=1e-2) == x.count


def test_an_image_outside_the_batch_is_an_error():
    with pytest.raises(DataError, match="region 1 names image 4, outside the batch"):
        run(numpy.ones((4, 1, 4, 4)), numpy.array([[0, 0, 0, 1, 1], [4, 0, 0, 1, 1]], dtype=float))


def test_pooled_size_is_required():
    with pytest.raises(ConfigError, match="pooled_h must be > 0"):
        create_layer({"type": "ROIPooling", "bottom": ["x", "r"], "top": "y"})
