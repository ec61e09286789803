"""caffe.io as pycaffe's test_io.py and its users (classify.py, detect.py) rely on it."""
import numpy
import pytest

import layerforge.pycaffe as caffe
from layerforge.errors import LayerforgeError


@pytest.fixture
def transformer():
    t = caffe.io.Transformer({"data": (1, 3, 4, 5)})
    t.set_transpose("data", (2, 0, 1))
    t.set_channel_swap("data", (2, 1, 0))
    t.set_raw_scale("data", 255)
    t.set_mean("data", numpy.array([10.0, 20.0, 30.0]))
    t.set_input_scale("data", 0.5)
    return t


def test_preprocess_applies_each_step_in_caffes_order(transformer):
    image = numpy.random.RandomState(0).rand(4, 5, 3).astype(numpy.float32)  # H x W x RGB in [0, 1]
    blob = transformer.preprocess("data", image)
    assert blob.shape == (3, 4, 5) and blob.dtype == numpy.float32
    want = (image.transpose(2, 0, 1)[[2, 1, 0]] * 255 - numpy.array([10.0, 20.0, 30.0])[:, None, None]) * 0.5
    numpy.testing.assert_allclose(blob, want, rtol=1e-5)
    numpy.testing.assert_allclose(transformer.deprocess("data", blob), image, rtol=1e-5, atol=1e-6)


def test_preprocess_resizes_to_the_input(transformer):
    blob = transformer.preprocess("data", numpy.ones((8, 10, 3), numpy.float32))
    assert blob.shape == (3, 4, 5)
    numpy.testing.assert_allclose(blob[0], (255 - 10) * 0.5)  # the mean goes with the channel after the swap


def test_setters_check_their_input():
    t = caffe.io.Transformer({"data": (1, 3, 4, 5)})
    with pytest.raises(LayerforgeError, match="not one of the net inputs"):
        t.set_raw_scale("image", 2)
    with pytest.raises(LayerforgeError, match="needs 3 axes"):
        t.set_transpose("data", (1, 0))
    with pytest.raises(LayerforgeError, match="needs 3 channels"):
        t.set_channel_swap("data", (1, 0))
    with pytest.raises(LayerforgeError, match="has 2 channels"):
        t.set_mean("data", numpy.zeros(2))
    t.set_mean("data", numpy.arange(3 * 8 * 10, dtype=numpy.float32).reshape(3, 8, 10))  # resized to 4 x 5
    assert t.mean["data"].shape == (3, 4, 5)


def test_load_image_is_rgb_in_unit_range(tmp_path):
    import cv2

    bgr = numpy.zeros((6, 7, 3), numpy.uint8)
    bgr[..., 2] = 255  # red
    cv2.imwrite(str(tmp_path / "red.png"), bgr)
    image = caffe.io.load_image(str(tmp_path / "red.png"))
    assert image.shape == (6, 7, 3) and image.dtype == numpy.float32
    numpy.testing.assert_array_equal(image[..., 0], 1.0)
    numpy.testing.assert_array_equal(image[..., 1:], 0.0)
    gray = caffe.io.load_image(str(tmp_path / "red.png"), color=False)
    assert gray.shape == (6, 7, 1)
    with pytest.raises(LayerforgeError, match="cannot read the image"):
        caffe.io.load_image(str(tmp_path / "missing.png"))


@pytest.mark.parametrize("bgr, grey", [((0, 0, 200), 0.2125 * 200 / 255), ((0, 200, 0), 0.7154 * 200 / 255),
                                       ((200, 0, 0), 0.0721 * 200 / 255), ((10, 20, 30), (0.2125 * 30 + 0.7154 * 20
                                                                                          + 0.0721 * 10) / 255)])
def test_load_image_grey_is_skimages_rgb2gray(tmp_path, bgr, grey):
    import cv2

    path = str(tmp_path / "colour.png")
    cv2.imwrite(path, numpy.full((3, 4, 3), bgr, numpy.uint8))
    image = caffe.io.load_image(path, color=False)  # pycaffe: skimage.io.imread(as_grey=True), BT.709 weights
    assert image.shape == (3, 4, 1) and image.dtype == numpy.float32
    numpy.testing.assert_allclose(image, grey, rtol=1e-6)
    if bgr == (0, 0, 200):
        assert round(float(image[0, 0, 0]), 4) == 0.1667  # pure red 200, as Caffe gives it


def test_load_image_of_a_grey_file(tmp_path):
    import cv2

    path = str(tmp_path / "grey.png")
    cv2.imwrite(path, numpy.full((3, 4), 51, numpy.uint8))
    numpy.testing.assert_allclose(caffe.io.load_image(path, color=False), 0.2, rtol=1e-6)
    colour = caffe.io.load_image(path)
    assert colour.shape == (3, 4, 3)
    numpy.testing.assert_allclose(colour, 0.2, rtol=1e-6)


def test_resize_image_keeps_channels_and_constant_images():
    image = numpy.full((4, 6, 5), 0.25, numpy.float32)
    out = caffe.io.resize_image(image, (8, 3))
    assert out.shape == (8, 3, 5)
    numpy.testing.assert_allclose(out, 0.25)
    assert caffe.io.resize_image(numpy.zeros((4, 4, 1)), (2, 2)).shape == (2, 2, 1)


def test_oversample_ten_crops():
    image = numpy.arange(5 * 6 * 1, dtype=numpy.float32).reshape(5, 6, 1)
    crops = caffe.io.oversample([image], (3, 4))
    assert crops.shape == (10, 3, 4, 1)
    corners = [image[:3, :4], image[:3, 2:], image[2:, :4], image[2:, 2:], image[1:4, 1:5]]
    for k, crop in enumerate(corners):
        numpy.testing.assert_array_equal(crops[k], crop)
        numpy.testing.assert_array_equal(crops[5 + k], crop[:, ::-1])


def test_layer_type_list_has_the_standard_types():
    for name in ("Data", "Convolution", "InnerProduct"):
        assert name in caffe.layer_type_list()


def test_blobproto_and_datum_conversions():
    arr = numpy.random.RandomState(0).rand(2, 3, 4).astype(numpy.float32)
    blob = caffe.io.array_to_blobproto(arr, diff=arr * 2)
    assert list(blob.shape.dim) == [2, 3, 4]
    numpy.testing.assert_array_equal(caffe.io.blobproto_to_array(blob), arr)
    numpy.testing.assert_array_equal(caffe.io.blobproto_to_array(blob, return_diff=True), arr * 2)
    arrays = caffe.io.blobprotovector_str_to_arraylist(caffe.io.arraylist_to_blobprotovector_str([arr, arr[0]]))
    assert [a.shape for a in arrays] == [(2, 3, 4), (3, 4)]
    image = (arr * 255).astype(numpy.uint8)
    datum = caffe.io.array_to_datum(image, label=7)
    assert datum.label == 7 and datum.data == image.tobytes()
    numpy.testing.assert_array_equal(caffe.io.datum_to_array(datum), image)
    numpy.testing.assert_allclose(caffe.io.datum_to_array(caffe.io.array_to_datum(arr)), arr)
    with pytest.raises(ValueError, match="Incorrect array shape"):
        caffe.io.array_to_datum(arr[0])
