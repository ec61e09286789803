"""The SSD fork's NoiseParameter (ApplyNoise in util/im_transforms.cpp): each step against an independent
computation, ``prob``, seeding, the boxes left alone, and a prototxt with ``noise_param`` converted and run."""
import os

import cv2
import numpy
import pytest

from layerforge.data.detection_transform import NOISE, apply_noise
from layerforge.errors import ConfigError
from layerforge.net.net import Net
from layerforge.schema import Context, validate_block
from layerforge.solvers.caffe_import import convert_file


def noise(**kw):
    return validate_block(kw, NOISE, Context())


def picture(channels=3, seed=0):
    """A smooth gradient plus noise (10 x 12): every value 0..255 occurs in some form, no channel equals another."""
    r = numpy.random.default_rng(seed)
    ramp = numpy.add.outer(numpy.arange(10) * 9, numpy.arange(12) * 7)[:, :, None] + numpy.arange(channels) * 40
    return numpy.clip(ramp + r.integers(0, 30, ramp.shape), 0, 255).astype(numpy.uint8)


def run(image, seed=0, **kw):
    return apply_noise(image.copy(), noise(**kw), numpy.random.default_rng(seed))


def luma(image, equalize):
    ycrcb = cv2.cvtColor(image, cv2.COLOR_BGR2YCrCb)
    ycrcb[:, :, 0] = equalize(ycrcb[:, :, 0].copy())
    return cv2.cvtColor(ycrcb, cv2.COLOR_YCrCb2BGR)


def test_each_step_against_opencv():
    image = picture()
    grey = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)
    out = run(image, decolorize=True)
    assert (out == grey[:, :, None]).all() and len(numpy.unique(out)) > 20
    numpy.testing.assert_array_equal(run(image, inverse=True), 255 - image.astype(int))
    posterized = run(image, posterize=True)
    numpy.testing.assert_array_equal(posterized, image // 64 * 64 + 32)
    assert set(numpy.unique(posterized)) <= {32, 96, 160, 224}
    numpy.testing.assert_array_equal(run(image, gauss_blur=True), cv2.GaussianBlur(image, (7, 7), 1.5))
    numpy.testing.assert_array_equal(run(image, hist_eq=True), luma(image, cv2.equalizeHist))
    clahe = cv2.createCLAHE(clipLimit=4.0, tileGridSize=(8, 8))
    numpy.testing.assert_array_equal(run(image, clahe=True), luma(image, clahe.apply))
    jpeg = cv2.imdecode(cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 20])[1], cv2.IMREAD_COLOR)
    numpy.testing.assert_array_equal(run(image, jpeg=20), jpeg)
    assert (jpeg != image).any()
    eroded = run(image, erode=True)  # a 3 x 3 ellipse is the plus sign: the minimum over the 4-neighbourhood
    padded = numpy.pad(image.astype(int), ((1, 1), (1, 1), (0, 0)), mode="edge")
    plus = numpy.minimum.reduce([padded[1:-1, 1:-1], padded[:-2, 1:-1], padded[2:, 1:-1], padded[1:-1, :-2],
                                 padded[1:-1, 2:]])
    numpy.testing.assert_array_equal(eroded, plus)
    numpy.testing.assert_array_equal(run(image, convert_to_hsv=True), cv2.cvtColor(image, cv2.COLOR_BGR2HSV))


@pytest.mark.parametrize("values, channels", [([0], 3), ([7, 8, 9], 3), ([255], 1)])
def test_salt_and_pepper_sets_the_fraction(values, channels):
    image = numpy.full((10, 12, channels), 100, numpy.uint8)
    out = run(image, saltpepper=True, saltpepper_param={"fraction": 0.25, "value": values})
    changed = (out != 100).any(axis=2)
    assert changed.sum() == 30  # floor(0.25 x 120) distinct pixels
    expected = numpy.broadcast_to(numpy.array(values, numpy.uint8), (30, channels))
    numpy.testing.assert_array_equal(out[changed], expected)


def test_grey_images_keep_one_channel():
    image = picture(1)
    numpy.testing.assert_array_equal(run(image, hist_eq=True)[:, :, 0], cv2.equalizeHist(image[:, :, 0]))
    out = run(image, decolorize=True, jpeg=50, gauss_blur=True)
    assert out.shape == image.shape


def test_the_steps_come_in_the_fork_order():
    image = picture()
    both = run(image, decolorize=True, inverse=True, posterize=True)
    grey = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)[:, :, None].repeat(3, axis=2)
    numpy.testing.assert_array_equal(both, 255 - (grey // 64 * 64 + 32))  # posterize before inverse


def test_prob_and_seed():
    image = picture()
    kw = dict(saltpepper=True, saltpepper_param={"fraction": 0.1, "value": [0]})
    numpy.testing.assert_array_equal(run(image, prob=0.0, inverse=True, **kw), image)
    numpy.testing.assert_array_equal(run(image, seed=3, **kw), run(image, seed=3, **kw))
    assert (run(image, seed=3, **kw) != run(image, seed=4, **kw)).any()
    applied = [(run(image, seed=s, prob=0.5, inverse=True) != image).any() for s in range(40)]
    assert 8 < sum(applied) < 32


NET = """
layer {{
  name: "data" type: "AnnotatedData" top: "data" top: "label"
  include {{ phase: TRAIN }}
  transform_param {{
    mirror: true
    resize_param {{ prob: 1 resize_mode: WARP height: 20 width: 20 }}
    noise_param {{ prob: {prob} hist_eq: true inverse: true saltpepper: true
                  saltpepper_param {{ fraction: {fraction} value: 0 }} }}
  }}
  data_param {{ source: "{source}" batch_size: 2 }}
}}
"""


def test_prototxt_converts_and_runs(tmp_path):
    from tests.layers.test_annotated_data import scenes
    source = scenes(tmp_path / "db", 2)
    path = tmp_path / "net.prototxt"
    path.write_text(NET.format(prob=1, fraction=0.5, source=source))
    kind, net, _ = convert_file(str(path))
    assert net["layers"][0]["transform"]["noise_param"]["saltpepper_param"] == {"fraction": 0.5, "value": 0}
    net["layers"][0]["data"]["decode_workers"] = 1
    # the tests above ran OpenCV's thread pool in this process: a forked worker inherits it without its threads
    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    model = Net(net, phase="train")
    try:
        model.forward()
    finally:
        model.layers[0].close()  # its decode worker
        cv2.setNumThreads(threads)
    data = model.blobs["data"].data
    assert (numpy.asarray(data) == 0).mean(axis=(1, 2, 3)).min() >= 0.5  # half the pixels set to 0
    label = numpy.asarray(model.blobs["label"].data).reshape(-1, 8)
    assert len(label) == 2 and (label[:, 3:7] > 0).all()


@pytest.mark.parametrize("prob, fraction, key, line", [(1.5, 0.1, "noise_param.prob", 8),
                                                       (1, 2, "noise_param.saltpepper_param.fraction", 9)])
def test_bad_values_name_file_line_layer_and_key(tmp_path, prob, fraction, key, line):
    path = tmp_path / "net.prototxt"
    path.write_text(NET.format(prob=prob, fraction=fraction, source=tmp_path / "none"))
    with pytest.raises(ConfigError) as info:
        kind, net, _ = convert_file(str(path))
        Net(net, phase="train")
    message = str(info.value)
    assert "\n" not in message and "net.prototxt" in message and "data" in message and key in message, message
    assert f"net.prototxt:{line}: layer 'data'" in message, message


def test_refused_options():
    for kw, words in [({"convert_to_lab": True}, "convert_to_lab is not supported"),
                      ({"saltpepper": True}, "saltpepper needs saltpepper_param.value"),
                      ({"saltpepper_param": {"value": [1, 2]}}, "1 or 3 values")]:
        from layerforge.data.detection_transform import check_noise
        with pytest.raises(ValueError, match=words):
            check_noise(noise(**kw), lambda message, key: ValueError(f"{key}: {message}"))
