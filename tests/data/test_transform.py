import numpy
import pytest

from layerforge.data.transform import TRANSFORM, DataTransformer
from layerforge.errors import DataError
from layerforge.schema import Context, validate_block


def transformer(phase="TEST", dtype=numpy.float64, **block):
    return DataTransformer(validate_block(block, TRANSFORM, Context()), phase, dtype, source="src")


def batch(n=2, c=2, h=4, w=5):
    return numpy.arange(n * c * h * w, dtype=numpy.uint8).reshape(n, c, h, w)


def test_identity_casts():
    x = batch()
    y = transformer()(x, numpy.random.default_rng(0))
    assert y.dtype == numpy.float64
    numpy.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
def test_scale_and_mean_value(phase):
    x = batch()
    y = transformer(phase, scale=0.5, mean_value=[1, 2])(x, numpy.random.default_rng(0))
    expected = (x.astype(float) - numpy.array([1.0, 2.0]).reshape(1, 2, 1, 1)) * 0.5
    numpy.testing.assert_array_equal(y, expected)
    y1 = transformer(phase, mean_value=3)(x, numpy.random.default_rng(0))
    numpy.testing.assert_array_equal(y1, x - 3.0)


def test_centre_crop_in_test():
    x = batch(h=5, w=6)
    y = transformer("TEST", crop_size=3)(x, numpy.random.default_rng(0))
    # offsets (5 - 3) // 2 = 1 and (6 - 3) // 2 = 1
    numpy.testing.assert_array_equal(y, x[:, :, 1:4, 1:4])
    assert transformer("TEST", crop_size=3).output_shape((2, 5, 6)) == (2, 3, 3)


def test_random_crop_in_train_is_a_window_and_varies():
    x = numpy.random.RandomState(0).randint(0, 256, (64, 1, 6, 6)).astype(numpy.uint8)
    t = transformer("TRAIN", crop_size=4)
    y = t(x, numpy.random.default_rng(3))
    offsets = set()
    for i in range(len(x)):
        found = [(a, b) for a in range(3) for b in range(3) if numpy.array_equal(y[i], x[i, :, a:a + 4, b:b + 4])]
        assert found, f"image {i} is not a 4x4 window"
        offsets.add(found[0])
    assert len(offsets) == 9  # all offsets 0..2 x 0..2 drawn
    numpy.testing.assert_array_equal(t(x, numpy.random.default_rng(3)), y)  # same rng, same crops


def test_mirror_train_only():
    x = batch(n=32)
    y = transformer("TRAIN", mirror=True)(x, numpy.random.default_rng(0))
    flipped = [numpy.array_equal(y[i], x[i, :, :, ::-1]) for i in range(32)]
    kept = [numpy.array_equal(y[i], x[i]) for i in range(32)]
    assert all(f or k for f, k in zip(flipped, kept)) and 0 < sum(flipped) < 32
    numpy.testing.assert_array_equal(transformer("TEST", mirror=True)(x, numpy.random.default_rng(0)), x)


@pytest.mark.parametrize("ext", ["npy", "npz"])
def test_mean_file_is_cropped_at_the_same_offset(tmp_path, ext):
    x = batch(n=1, c=1, h=4, w=4)
    mean = numpy.arange(16, dtype=numpy.float32).reshape(1, 4, 4) * 0.25
    path = tmp_path / f"mean.{ext}"
    numpy.save(path, mean) if ext == "npy" else numpy.savez(path, mean=mean)
    y = transformer("TEST", mean_file=str(path), crop_size=2, scale=2.0)(x, numpy.random.default_rng(0))
    numpy.testing.assert_allclose(y[0], (x[0, :, 1:3, 1:3] - mean[:, 1:3, 1:3]) * 2.0)
    # the value at output (0, 0) by hand: pixel x[1,1] = 5, mean 5 * 0.25 -> (5 - 1.25) * 2
    assert y[0, 0, 0, 0] == 7.5


def test_mirror_with_mean_file(tmp_path):
    x = batch(n=16, c=1, h=3, w=3)
    mean = numpy.arange(9, dtype=numpy.float32).reshape(1, 3, 3)
    numpy.save(tmp_path / "m.npy", mean)
    y = transformer("TRAIN", mean_file=str(tmp_path / "m.npy"), mirror=True)(x, numpy.random.default_rng(1))
    for i in range(16):  # Caffe: subtract first, then flip
        d = x[i] - mean
        assert numpy.array_equal(y[i], d) or numpy.array_equal(y[i], d[:, :, ::-1])


def test_errors(tmp_path):
    with pytest.raises(DataError, match="src: give transform.mean_file or transform.mean_value, not both"):
        transformer(mean_file="m.npy", mean_value=[1])
    with pytest.raises(DataError, match=r"src: transform.crop_size 5 is larger than the images \(4x5\)"):
        transformer(crop_size=5).output_shape((1, 4, 5))
    with pytest.raises(DataError, match="mean_value has 2 values for 3-channel images"):
        transformer(mean_value=[1, 2]).output_shape((3, 4, 5))
    numpy.save(tmp_path / "m.npy", numpy.zeros((1, 2, 2)))
    with pytest.raises(DataError, match=r"has shape \(1, 2, 2\), the images have \(1, 4, 4\)"):
        transformer(mean_file=str(tmp_path / "m.npy")).output_shape((1, 4, 4))
    with pytest.raises(DataError, match="cannot read the mean file"):
        transformer(mean_file=str(tmp_path / "absent.npy"))


def test_finish_on_the_device_is_caffes_transform(tmp_path, xp):
    """Crops (uint8, mirrored while cropping) cross to the device; mean and scale are applied there."""
    from layerforge.backend import to_numpy

    mean = numpy.random.default_rng(2).random((3, 6, 7), dtype=numpy.float32) * 100
    numpy.save(tmp_path / "m.npy", mean)
    t = transformer("TRAIN", numpy.float32, mean_file=str(tmp_path / "m.npy"), crop_size=4, mirror=True, scale=0.25)
    batch = numpy.random.default_rng(3).integers(0, 256, (16, 3, 6, 7), dtype=numpy.uint8)
    h0, w0, flip = plan = t.plan(16, (3, 6, 7), numpy.random.default_rng(4))
    crops = numpy.empty((16, 3, 4, 4), numpy.uint8)
    for i in range(16):
        t.crop_into(crops[i], batch[i], h0[i], w0[i], flip[i])
    out = xp.empty((16, 3, 4, 4), xp.float32)
    t.finish(xp, xp.asarray(crops), plan, out)
    for i in range(16):  # Caffe: crop, subtract the mean cropped alike, scale, then mirror
        rows, cols = slice(h0[i], h0[i] + 4), slice(w0[i], w0[i] + 4)
        y = (batch[i][:, rows, cols].astype(numpy.float32) - mean[:, rows, cols]) * numpy.float32(0.25)
        numpy.testing.assert_array_equal(to_numpy(out[i]), y[:, :, ::-1] if flip[i] else y)
    assert 0 < flip.sum() < 16 and len(set(zip(h0, w0))) > 1


@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("channels", [1, 3, 4])
@pytest.mark.parametrize("layout", ["HWC", "CHW", "grey"])
def test_crop_into_copies_the_window_whatever_the_images_memory_order(flip, channels, layout):
    hwc = numpy.random.default_rng(channels).integers(0, 256, (9, 11, channels), dtype=numpy.uint8)
    image = {"HWC": hwc.transpose(2, 0, 1),  # decode_image's view of what OpenCV decoded (OpenCV copies it)
             "CHW": numpy.ascontiguousarray(hwc.transpose(2, 0, 1)),  # a raw Datum record (numpy copies it)
             "grey": hwc[:, :, 0][None]}[layout]
    out = numpy.empty((image.shape[0], 5, 6), numpy.uint8)
    DataTransformer.crop_into(out, image, 2, 3, flip)
    window = image[:, 2:7, 3:9]
    numpy.testing.assert_array_equal(out, window[:, :, ::-1] if flip else window)
