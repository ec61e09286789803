"""Every registered layer type, forward and backward, on each backend of the ``xp`` fixture.

One representative configuration per type (the data-source layers, which read files or the caller's
arrays, have their own backend tests in test_data.py, test_hdf5.py, test_input.py, test_memory_data.py,
test_synthetic_data.py, test_window_data.py and test_cpm_data.py). Each case runs on numpy and on the fixture's backend from the same seed and the same
parameters; tops, bottom gradients and parameter gradients must agree to 1e-10 (float64). On numpy alone
this runs every layer's forward and backward once and checks that the table covers every type; where a
device is present (the GPU suite) it is the layers' numpy / cupy agreement.
"""
import numpy
import pytest

from layerforge import rng
from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.layers import LAYER_REGISTRY, create_layer

# types whose tops come from files or from the caller, tested per backend in their own files
SOURCES = {"Data", "ImageData", "DenseImageData", "HDF5Data", "HDF5Output", "WindowData", "MemoryData", "TokenData", "Input",
           "DummyData", "SyntheticData", "Python", "AnnotatedData", "VideoData", "CPMData"}
GAUSS = {"type": "gaussian", "std": 0.5}


def x(*shape):
    return ("x", shape)


# type -> (parameter blocks, bottoms as (kind, shape), number of tops); kinds: x gaussian, pos in [0.5, 2],
# label3 class indices 0..2, index<n> indices below n, binary 0/1, cont sequence-continuation flags, prob
# rows of probabilities, shape gaussian values read for their shape only. Bottoms of the kinds in NO_GRADIENT get no gradient.
CASES = {
    "AbsVal": ({}, [x(2, 3, 4)], 1),
    "Accuracy": ({"accuracy": {"top_k": 2}}, [x(6, 3), ("label3", (6,))], 1),
    "ArgMax": ({"argmax": {"top_k": 2, "out_max_val": True}}, [x(3, 5)], 1),
    "BN": ({"bn": {"scale_filler": GAUSS, "shift_filler": GAUSS}}, [x(2, 3, 4, 4)], 3),
    "BNLL": ({}, [x(2, 3, 4)], 1),
    "BatchNorm": ({}, [x(3, 4, 3, 3)], 1),
    "BatchReindex": ({}, [x(4, 3), ("index4", (5,))], 1),
    "Bias": ({"bias": {"filler": GAUSS}}, [x(2, 3, 4)], 1),
    "Clip": ({"clip": {"min": -0.5, "max": 0.5}}, [x(2, 3, 4)], 1),
    "Concat": ({"concat": {"axis": 1}}, [x(2, 3, 4), x(2, 2, 4)], 1),
    "ContrastiveLoss": ({}, [x(4, 3), x(4, 3), ("binary", (4,))], 1),
    "Convolution": ({"convolution": {"num_output": 4, "kernel_size": 3, "pad": 1, "weight_filler": GAUSS,
                                     "bias_filler": GAUSS}}, [x(2, 3, 6, 6)], 1),
    "Crop": ({"crop": {"axis": 2, "offset": [1]}}, [x(2, 3, 6, 6), ("shape", (2, 3, 4, 4))], 1),
    "DetectionOutput": ({"detection_output": {"num_classes": 3, "code_type": "CENTER_SIZE", "keep_top_k": 5,
                                              "nms_param": {"nms_threshold": 0.45, "top_k": 4}}},
                        [x(2, 6 * 4), ("prob", (2, 6 * 3)), ("priors", (1, 2, 6 * 4))], 1),
    "DetectionEvaluate": ({"detection_evaluate": {"num_classes": 3}}, [("dets", (1, 1, 5, 7)), ("gt", (1, 1, 4, 8))],
                          1),
    "Deconvolution": ({"convolution": {"num_output": 2, "kernel_size": 3, "stride": 2, "weight_filler": GAUSS,
                                       "bias_filler": GAUSS}}, [x(2, 3, 4, 4)], 1),
    "Dropout": ({"dropout": {"dropout_ratio": 0.3}}, [x(4, 5)], 1),
    "ELU": ({"elu": {"alpha": 0.7}}, [x(2, 3, 4)], 1),
    "Eltwise": ({"eltwise": {"operation": "PROD"}}, [x(2, 3, 4), x(2, 3, 4)], 1),
    "Embed": ({"embed": {"num_output": 4, "input_dim": 5, "weight_filler": GAUSS, "bias_filler": GAUSS}},
              [("index5", (2, 3))], 1),
    "EuclideanLoss": ({}, [x(3, 4), x(3, 4)], 1),
    "Exp": ({"exp": {"scale": 0.5, "shift": 0.1}}, [x(2, 3, 4)], 1),
    "Filter": ({}, [x(4, 3), ("binary", (4,))], 1),
    "Flatten": ({}, [x(2, 3, 4)], 1),
    "HingeLoss": ({}, [x(4, 3), ("label3", (4,))], 1),
    "MultiBoxLoss": ({"multibox_loss": {"num_classes": 3, "code_type": "CENTER_SIZE", "overlap_threshold": 0.3}},
                     [x(2, 6 * 4), x(2, 6 * 3), ("priors", (1, 2, 6 * 4)), ("gt", (1, 1, 4, 8))], 1),
    "Im2col": ({"convolution": {"kernel_size": 3, "pad": 1}}, [x(2, 3, 5, 5)], 1),
    "InfogainLoss": ({}, [x(4, 3), ("label3", (4,)), ("pos", (3, 3))], 1),
    "InnerProduct": ({"inner_product": {"num_output": 5, "weight_filler": GAUSS, "bias_filler": GAUSS}},
                     [x(2, 3, 4)], 1),
    "LRN": ({"lrn": {"local_size": 3, "alpha": 0.5, "beta": 0.75}}, [x(2, 5, 4, 4)], 1),
    "LSTM": ({"recurrent": {"num_output": 5, "weight_filler": GAUSS, "bias_filler": GAUSS}},
             [x(3, 2, 4), ("cont", (3, 2))], 1),
    "LSTMUnit": ({}, [x(1, 2, 5), x(1, 2, 20), ("cont", (1, 2))], 2),
    "Log": ({"log": {"base": 2.0, "scale": 1.5}}, [("pos", (2, 3, 4))], 1),
    "MVN": ({}, [x(2, 3, 4, 4)], 1),
    "MultinomialLogisticLoss": ({}, [("prob", (4, 3)), ("label3", (4,))], 1),
    "Normalize": ({"norm": {"across_spatial": False, "channel_shared": False, "scale_filler": GAUSS}},
                  [x(2, 3, 2, 2)], 1),
    "PReLU": ({"prelu": {"filler": GAUSS}}, [x(2, 3, 4)], 1),
    "Parameter": ({"parameter": {"shape": [2, 3], "filler": GAUSS}}, [], 1),
    "Permute": ({"permute": {"order": [0, 2, 3, 1]}}, [x(2, 3, 2, 4)], 1),
    "Pooling": ({"pooling": {"pool": "MAX", "kernel_size": 3, "stride": 2, "pad": 1}}, [x(2, 3, 7, 7)], 1),
    "Power": ({"power": {"power": 1.5, "scale": 0.7, "shift": 0.2}}, [("pos", (2, 3, 4))], 1),
    "PriorBox": ({"prior_box": {"min_size": [4], "max_size": [9], "aspect_ratio": [2], "clip": True}},
                 [("shape", (1, 2, 3, 2)), ("shape", (1, 3, 12, 8))], 1),
    "ROIPooling": ({"roi_pooling": {"pooled_h": 2, "pooled_w": 3, "spatial_scale": 0.5}},
                   [x(2, 3, 6, 8), ("rois", (3, 5))], 1),
    "RNN": ({"recurrent": {"num_output": 5, "weight_filler": GAUSS, "bias_filler": GAUSS}},
            [x(3, 2, 4), ("cont", (3, 2))], 1),
    "ReLU": ({"relu": {"negative_slope": 0.1}}, [x(2, 3, 4)], 1),
    "Reduction": ({"reduction": {"operation": "SUMSQ", "axis": 1}}, [x(2, 3, 4)], 1),
    "Reshape": ({"reshape": {"shape": [0, -1]}}, [x(2, 3, 4)], 1),
    "SPP": ({"spp": {"pyramid_height": 2}}, [x(2, 3, 8, 8)], 1),
    "Scale": ({"scale": {"filler": GAUSS, "bias_term": True, "bias_filler": GAUSS}}, [x(2, 3, 4)], 1),
    "Sigmoid": ({}, [x(2, 3, 4)], 1),
    "SigmoidCrossEntropyLoss": ({}, [x(4, 3), ("binary", (4, 3))], 1),
    "Silence": ({}, [x(2, 3)], 0),
    "Slice": ({"slice": {"axis": 1, "slice_point": [2]}}, [x(2, 6, 3)], 2),
    "Softmax": ({}, [x(2, 5, 3)], 1),
    "SmoothL1Loss": ({"smooth_l1_loss": {"sigma": 2.0}}, [x(3, 8), x(3, 8), ("binary", (3, 8)), ("binary", (3, 8))], 1),
    "SoftmaxWithLoss": ({"loss": {"ignore_label": 1}}, [x(6, 3, 2), ("label3", (6, 2))], 1),
    "Split": ({}, [x(2, 3)], 2),
    "Swish": ({"swish": {"beta": 1.3}}, [x(2, 3, 4)], 1),
    "TanH": ({}, [x(2, 3, 4)], 1),
    "Threshold": ({"threshold": {"threshold": 0.1}}, [x(2, 3, 4)], 1),
    "Tile": ({"tile": {"axis": 1, "tiles": 2}}, [x(2, 3, 4)], 1),
    "Upsample": ({"upsample": {"scale": 2}}, [x(2, 3, 2, 3), ("upmask", (2, 3, 2, 3))], 1),
}
NO_GRADIENT = {"label3", "index4", "index5", "binary", "cont", "shape", "priors", "rois", "upmask", "gt", "dets"}


def values(kind, shape, r):
    if kind in ("x", "shape"):
        return r.standard_normal(shape)
    if kind == "pos":
        return r.uniform(0.5, 2.0, shape)
    if kind == "label3":
        return r.integers(0, 3, shape).astype(float)
    if kind.startswith("index"):
        return r.integers(0, int(kind[5:]), shape).astype(float)
    if kind == "binary":
        v = r.integers(0, 2, shape).astype(float)
        v.reshape(-1)[0] = 1.0  # Filter keeps at least one item
        return v
    if kind == "cont":
        v = numpy.ones(shape)
        v[0] = 0.0
        return v
    if kind == "upmask":  # the mask of a 2x2 MAX pooling: one place in each 2x2 block of the doubled plane
        n, c, h, w = shape
        rows, cols = numpy.meshgrid(numpy.arange(h), numpy.arange(w), indexing="ij")
        picks = r.integers(0, 2, (2,) + shape)
        return ((2 * rows + picks[0]) * 2 * w + 2 * cols + picks[1]).astype(float)
    if kind == "rois":  # [image, x1, y1, x2, y2] inside a 16x12 image of the first two
        lo = r.uniform(0, 6, (shape[0], 2))
        return numpy.concatenate([r.integers(0, 2, (shape[0], 1)), lo, lo + r.uniform(1, 8, (shape[0], 2))], axis=1)
    if kind == "priors":  # normalized boxes and their variances, as PriorBox writes them
        lo = r.uniform(0, 0.6, (shape[2] // 4, 2))
        boxes = numpy.concatenate([lo, lo + r.uniform(0.1, 0.4, lo.shape)], axis=1)
        return numpy.stack([boxes.reshape(-1), numpy.tile([0.1, 0.1, 0.2, 0.2], shape[2] // 4)])[None]
    if kind in ("gt", "dets"):  # boxes of images 0 and 1, classes 1 and 2: AnnotatedData's / DetectionOutput's rows
        lo = r.uniform(0, 0.6, (shape[2], 2))
        boxes = numpy.concatenate([lo, lo + r.uniform(0.1, 0.4, lo.shape)], axis=1)
        image, label = numpy.arange(shape[2]) % 2, 1 + numpy.arange(shape[2]) // 2 % 2
        middle = r.uniform(0, 1, shape[2]) if kind == "dets" else numpy.zeros(shape[2])  # a score, an instance
        rows = [image, label, middle] + list(boxes.T) + ([] if kind == "dets" else [numpy.zeros(shape[2])])
        return numpy.stack(rows, axis=1).reshape(shape)
    if kind == "prob":
        e = numpy.exp(r.standard_normal(shape))
        return e / e.sum(axis=1, keepdims=True)
    raise ValueError(kind)


def run(type_, xp, weights=None):
    """Set up, forward, backward on ``xp`` from seed 5; returns the layer's parameters and every result, on the host."""
    blocks, bottoms, tops = CASES[type_]
    rng.seed(5)
    r = numpy.random.default_rng(5)
    layer = create_layer({"type": type_, "bottom": [f"b{i}" for i in range(len(bottoms))],
                          "top": [f"t{i}" for i in range(tops)], **blocks}, dtype=numpy.float64, xp=xp)
    bottom = []
    for kind, shape in bottoms:
        blob = Blob(shape, numpy.float64, xp)
        blob.data[...] = xp.asarray(values(kind, shape, r))
        bottom.append(blob)
    top = [Blob((), numpy.float64, xp) for _ in range(tops)]
    layer.setup(bottom, top)
    if weights is not None:
        for blob, w in zip(layer.blobs, weights):
            blob.data[...] = xp.asarray(w)
    params = [to_numpy(b.data).copy() for b in layer.blobs]
    layer.forward(bottom, top)
    results = {f"top {i}": to_numpy(t.data).copy() for i, t in enumerate(top)}
    if layer.has_backward:
        for t in top:
            t.diff[...] = xp.asarray(r.standard_normal(t.shape))
        for b in bottom:
            b.diff[...] = 7.0  # bottom gradients are written, not added: none of this may survive
        for b in layer.blobs:
            b.diff[...] = 0
        down = [kind not in NO_GRADIENT and not (type_ == "InfogainLoss" and i == 2)
                for i, (kind, _) in enumerate(bottoms)]
        layer.backward(top, down, bottom)
        results.update({f"bottom {i} diff": to_numpy(b.diff).copy() for i, b in enumerate(bottom) if down[i]})
        results.update({f"param {i} diff": to_numpy(b.diff).copy() for i, b in enumerate(layer.blobs)})
    return params, results


def test_the_table_covers_every_registered_type():
    own = {t for t, cls in LAYER_REGISTRY.items() if cls.__module__.startswith("layerforge.")}  # not tests' types
    assert set(CASES) | SOURCES == own


@pytest.mark.parametrize("type_", sorted(CASES))
def test_layer_agrees_with_numpy(type_, xp):
    params, want = run(type_, numpy)
    _, got = run(type_, xp, weights=params)
    assert want and set(got) == set(want)
    assert any(numpy.abs(v).sum() > 0 for v in want.values()) or type_ == "Silence"  # the case computes something
    assert not any((v == 7.0).all() for k, v in want.items() if k.startswith("bottom"))
    for name, value in want.items():
        numpy.testing.assert_allclose(got[name], value, rtol=1e-10, atol=1e-12, err_msg=f"{type_}: {name}")
