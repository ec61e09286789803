"""caffe.Classifier and caffe.Detector against a hand-written reference of Caffe's behaviour (python/caffe/
classifier.py and detector.py): crops, oversampling, preprocessing order, context padding with mean fill.

The net is one InnerProduct and a Softmax over an 8x8 RGB input, so its output is worked out in numpy here.
"""
import cv2
import numpy
import pytest

import layerforge.pycaffe as caffe

SIZE, CLASSES = 8, 4
pytestmark = pytest.mark.usefixtures("caffe_mode")  # every test in CPU mode and in GPU mode

DEPLOY = f"""name: 'tiny'
input: 'data' input_shape {{ dim: 1 dim: 3 dim: {SIZE} dim: {SIZE} }}
layer {{ name: 'ip' type: 'InnerProduct' bottom: 'data' top: 'ip'
  inner_product_param {{ num_output: {CLASSES} weight_filler {{ type: 'gaussian' std: 0.01 }}
    bias_filler {{ type: 'gaussian' std: 1 }} }} }}
layer {{ name: 'prob' type: 'Softmax' bottom: 'ip' top: 'prob' }}
"""
MEAN_BGR = numpy.array([104.0, 117.0, 123.0])


@pytest.fixture
def model(tmp_path):
    deploy = tmp_path / "deploy.prototxt"
    deploy.write_text(DEPLOY)
    net = caffe.Net(str(deploy), caffe.TEST)
    weights = tmp_path / "tiny.caffemodel"
    net.save(str(weights))
    W, b = net.params["ip"][0].data.astype(numpy.float64), net.params["ip"][1].data.astype(numpy.float64)
    return str(deploy), str(weights), W, b


def reference_probs(W, b, crop_rgb):
    """Caffe's preprocessing of one (8, 8, 3) RGB [0, 1] crop, then the net, in float64."""
    x = crop_rgb.transpose(2, 0, 1)[[2, 1, 0]] * 255.0 - MEAN_BGR[:, None, None]  # transpose, swap, raw, mean
    x = x * 0.5  # input_scale
    z = W @ x.ravel() + b
    e = numpy.exp(z - z.max())
    return e / e.sum()


def image(rs, h, w):
    return rs.rand(h, w, 3).astype(numpy.float32)


@pytest.mark.parametrize("oversample", [True, False])
@pytest.mark.parametrize("image_dims", [None, (11, 13)])
def test_classifier_predict_is_caffes(model, oversample, image_dims):
    deploy, weights, W, b = model
    classifier = caffe.Classifier(deploy, weights, image_dims=image_dims, mean=MEAN_BGR, input_scale=0.5,
                                  raw_scale=255, channel_swap=(2, 1, 0))
    rs = numpy.random.RandomState(0)
    inputs = [image(rs, 20, 17), image(rs, 9, 30), image(rs, 8, 8)]
    got = classifier.predict(inputs, oversample=oversample)
    h, w = image_dims or (SIZE, SIZE)
    want = []
    for im in inputs:
        resized = cv2.resize(im, (w, h), interpolation=cv2.INTER_LINEAR)
        if oversample:  # corners, centre; then the same mirrored; averaged
            starts = [(0, 0), (0, w - SIZE), (h - SIZE, 0), (h - SIZE, w - SIZE), ((h - SIZE) // 2, (w - SIZE) // 2)]
            crops = [resized[y:y + SIZE, x:x + SIZE] for y, x in starts]
            crops += [c[:, ::-1] for c in crops]
        else:  # centre -/+ half the crop, truncated
            y0, x0 = int(h / 2.0 - SIZE / 2.0), int(w / 2.0 - SIZE / 2.0)
            crops = [resized[y0:y0 + SIZE, x0:x0 + SIZE]]
        want.append(numpy.mean([reference_probs(W, b, c) for c in crops], axis=0))
    assert got.shape == (3, CLASSES)
    numpy.testing.assert_allclose(got, numpy.array(want), rtol=1e-5, atol=1e-6)


@pytest.fixture
def picture(tmp_path):
    rs = numpy.random.RandomState(1)
    bgr = rs.randint(0, 256, size=(12, 14, 3)).astype(numpy.uint8)
    path = tmp_path / "picture.png"
    cv2.imwrite(str(path), bgr)
    return str(path), bgr[:, :, ::-1].astype(numpy.float32) / 255.0


def test_detector_windows_without_context_are_plain_crops(model, picture):
    deploy, weights, W, b = model
    path, rgb = picture
    detector = caffe.Detector(deploy, weights, mean=MEAN_BGR, input_scale=0.5, raw_scale=255,
                              channel_swap=(2, 1, 0))
    windows = numpy.array([[0, 0, 8, 8], [2, 3, 10, 11], [4, 6, 12, 14]])
    detections = detector.detect_windows([(path, windows)])
    assert [d["filename"] for d in detections] == [path] * 3
    for detection, window in zip(detections, windows):
        numpy.testing.assert_array_equal(detection["window"], window)
        y0, x0, y1, x1 = window
        numpy.testing.assert_allclose(detection["prediction"], reference_probs(W, b, rgb[y0:y1, x0:x1]),
                                      rtol=1e-5, atol=1e-6)


def test_detector_context_pad_grows_the_box_and_fills_outside_with_the_mean(model, picture):
    deploy, weights, W, b = model
    path, rgb = picture
    detector = caffe.Detector(deploy, weights, mean=MEAN_BGR, input_scale=0.5, raw_scale=255,
                              channel_swap=(2, 1, 0), context_pad=2)
    assert list(detector.crop_dims) == [SIZE, SIZE, 3]
    mean_rgb = MEAN_BGR[::-1] / 255.0  # the mean back in raw image values: unswapped, raw scale undone
    numpy.testing.assert_allclose(detector.crop_mean.reshape(3), mean_rgb, rtol=1e-6)
    # size 8, pad 2: scale 8 / (8 - 4) = 2. Window (2, 2, 5, 5): half 2, centre (4, 4), box (0, 0, 8, 8) inside
    # the image, 9 rows -> 8 * 9/9 = 8: the crop is the image's [0:8, 0:8] as it is
    numpy.testing.assert_allclose(detector.crop(rgb, [2, 2, 5, 5]), rgb[0:8, 0:8], atol=1e-6)
    # window (0, 0, 3, 3): box (-2, -2, 6, 6); 2 rows and columns of padding (round(2 * 8/9)), then the image's
    # [0:6, 0:6] (round(7 * 8/9) = 6 rows), the rest the mean
    crop = detector.crop(rgb, [0, 0, 3, 3])
    want = numpy.ones((8, 8, 3)) * mean_rgb
    want[2:8, 2:8] = rgb[0:6, 0:6]
    numpy.testing.assert_allclose(crop, want, atol=1e-6)
    detection = detector.detect_windows([(path, [[0, 0, 3, 3]])])[0]
    numpy.testing.assert_allclose(detection["prediction"], reference_probs(W, b, want), rtol=1e-5, atol=1e-6)


def test_selective_search_without_its_matlab_package_is_one_line(model, picture):
    deploy, weights, _, _ = model
    detector = caffe.Detector(deploy, weights)
    with pytest.raises(caffe.LayerforgeError, match="selective_search_ijcv_with_python.*--crop_mode=list"):
        detector.detect_selective_search([picture[0]])
