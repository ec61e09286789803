"""Data and ImageData with the SSD fork's transform keys (resize_param, noise_param, crop_h / crop_w): every image
resized, noised and cropped as the fork's DataTransformer does for a decoded image, checked against OpenCV."""
import cv2
import numpy
import pytest

import layerforge.layers.data  # noqa: F401  (registers Data and ImageData)
from layerforge.blob import Blob
from layerforge.solvers.caffe_import import convert_file
from layerforge.data.datum import encoded_datum
from layerforge.data.lmdb_io import LMDBWriter
from layerforge.errors import ConfigError, DataError
from layerforge.layers import create_layer
from layerforge.net import Net
from tests.layers import test_data


def pictures(n=6, shape=(12, 16)):
    """``n`` random BGR pictures (H, W, 3) uint8, with some structure so that resizing matters."""
    g = numpy.random.default_rng(0)
    ramp = numpy.add.outer(numpy.arange(shape[0]) * 9, numpy.arange(shape[1]) * 5)
    return [((ramp[..., None] + g.integers(0, 60, shape + (3,))) % 256).astype(numpy.uint8) for _ in range(n)]


def write_encoded_db(path, images):
    """An LMDB of encoded (PNG) Datums, as convert_imageset --encoded writes it; record i has label i."""
    with LMDBWriter(str(path)) as w:
        for i, image in enumerate(images):
            w.put(encoded_datum(cv2.imencode(".png", image)[1].tobytes(), i).SerializeToString())
    return str(path)


def data_layer(source, transform, phase="TEST", xp=numpy, **data):
    return test_data.data_layer(source, phase, xp, transform, **dict({"batch_size": 3, "decode_workers": 1}, **data))


def batches(layer, top, count):
    try:
        return test_data.take(layer, top, count)
    finally:
        layer.close()  # its decode workers


def chw(hwc):
    return hwc.transpose(2, 0, 1).astype(numpy.float64)


@pytest.mark.parametrize("noise", [False, True])
def test_resize_then_noise_then_crop_as_opencv_computes_them(tmp_path, xp, noise):
    images = pictures()
    source = write_encoded_db(tmp_path / "db", images)
    transform = {"resize_param": {"resize_mode": "WARP", "height": 10, "width": 14}, "crop_h": 6, "crop_w": 8,
                 "mean_value": [10, 20, 30], "scale": 0.5}
    if noise:
        transform["noise_param"] = {"inverse": True}
    layer, top = data_layer(source, transform, xp=xp)
    assert top[0].shape == (3, 3, 6, 8)
    (data, label), = batches(layer, top, 1)
    for i in range(3):
        resized = cv2.resize(images[i], (14, 10), interpolation=cv2.INTER_LINEAR)
        if noise:
            resized = 255 - resized
        crop = resized[2:8, 3:11]  # TEST: the centred window
        want = (chw(crop) - numpy.array([10, 20, 30]).reshape(3, 1, 1)) * 0.5
        numpy.testing.assert_array_equal(data[i], want)
    numpy.testing.assert_array_equal(label, [0, 1, 2])


def test_train_batches_are_a_function_of_the_seed_and_position(tmp_path):
    """Random interpolation, crops, mirrors and noise drawn per image: the same batches with 1 and 2 decode
    workers, and again after a restored state."""
    source = write_encoded_db(tmp_path / "db", pictures(8))
    transform = {"resize_param": {"resize_mode": "WARP", "height": 10, "width": 12, "interp_mode": ["LINEAR", "AREA",
                                                                                                       "NEAREST"]},
                 "crop_h": 7, "crop_w": 9, "mirror": True,
                 "noise_param": {"prob": 0.5, "saltpepper": True, "saltpepper_param": {"fraction": 0.2, "value": [0]}}}
    runs = []
    for workers in (1, 2):
        from layerforge import rng
        rng.seed(3)
        layer, top = data_layer(source, transform, phase="TRAIN", decode_workers=workers, prefetch=2, shuffle=True)
        runs.append(batches(layer, top, 4))
        if workers == 2:
            state = layer.get_state()
    for (a, la), (b, lb) in zip(*runs):
        numpy.testing.assert_array_equal(a, b)
        numpy.testing.assert_array_equal(la, lb)
    datas = numpy.concatenate([d for d, _ in runs[0]])
    assert len({d.tobytes() for d in datas}) == len(datas)  # crops, mirrors and noise differ
    salted = (datas == 0).all(axis=1).mean(axis=(1, 2))  # pixels set to 0 in every channel
    assert (salted >= 0.15).any() and (salted < 0.1).any()  # prob 0.5: some images salted, some not
    rng.seed(3)
    layer, top = data_layer(source, transform, phase="TRAIN", decode_workers=1, prefetch=2, shuffle=True)
    layer.set_state(state)
    numpy.testing.assert_array_equal(batches(layer, top, 1)[0][0], batches_after(source, transform, state))


def batches_after(source, transform, state):
    """The first batch of a fresh layer restored to ``state`` (another layer object, other workers)."""
    layer, top = data_layer(source, transform, phase="TRAIN", decode_workers=2, prefetch=0, shuffle=True)
    layer.set_state(state)
    return batches(layer, top, 1)[0][0]


def test_image_data_of_several_sizes_resized_to_one(tmp_path):
    images = [pictures(1, shape)[0] for shape in ((12, 16), (9, 20), (15, 11))]
    lines = []
    for i, image in enumerate(images):
        cv2.imwrite(str(tmp_path / f"{i}.png"), image)
        lines.append(f"{i}.png {i}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    layer = create_layer({"name": "img", "type": "ImageData", "top": ["data", "label"],
                          "image_data": {"source": str(tmp_path / "list.txt"), "root_folder": str(tmp_path),
                                         "batch_size": 3, "prefetch": 0, "decode_workers": 1},
                          "transform": {"resize_param": {"resize_mode": "WARP", "height": 8, "width": 8,
                                                         "interp_mode": ["AREA"]}}},
                         phase="TEST", dtype=numpy.float32)
    top = [Blob(), Blob()]
    layer.setup([], top)
    (data, label), = batches(layer, top, 1)
    assert data.shape == (3, 3, 8, 8)
    for i, image in enumerate(images):
        numpy.testing.assert_array_equal(data[i], chw(cv2.resize(image, (8, 8), interpolation=cv2.INTER_AREA)))
    numpy.testing.assert_array_equal(label, [0, 1, 2])


def test_a_fork_prototxt_with_resize_and_noise_on_data_converts_and_runs(tmp_path):
    source = write_encoded_db(tmp_path / "db", pictures())
    (tmp_path / "net.prototxt").write_text(f"""name: "classifier"
layer {{ name: "data" type: "Data" top: "data" top: "label" include {{ phase: TRAIN }}
  transform_param {{ mirror: true crop_h: 8 crop_w: 8 mean_value: 104 mean_value: 117 mean_value: 123
    resize_param {{ prob: 1 resize_mode: WARP height: 10 width: 10 interp_mode: LINEAR interp_mode: CUBIC }}
    noise_param {{ prob: 0.5 gauss_blur: true }} }}
  data_param {{ source: "{source}" batch_size: 2 backend: LMDB }} }}
layer {{ name: "fc" type: "InnerProduct" bottom: "data" top: "fc" inner_product_param {{ num_output: 3 }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }}
""")
    kind, netdef, _ = convert_file(str(tmp_path / "net.prototxt"))
    transform = netdef["layers"][0]["transform"]
    assert transform["resize_param"]["interp_mode"] == ["LINEAR", "CUBIC"] and transform["crop_h"] == 8
    net = Net(netdef, phase="train")
    try:
        loss = net.forward()["loss"]
    finally:
        net.layers[0].close()
    assert net.blobs["data"].shape == (2, 3, 8, 8) and numpy.isfinite(loss)


@pytest.mark.parametrize("transform, data, key", [
    ({"resize_param": {"resize_mode": "FIT_SMALL_SIZE", "height": 8, "width": 8}}, {"batch_size": 2},
     "data.batch_size"),
    ({"crop_h": 4}, {}, "transform.crop_h"),
    ({"resize_param": {"resize_mode": "WARP", "height": 0, "width": 8}}, {}, "transform.resize_param.height"),
    ({"noise_param": {"jpeg": 101}}, {}, "transform.noise_param.jpeg"),
])
def test_bad_fork_keys_name_the_key(tmp_path, transform, data, key):
    source = write_encoded_db(tmp_path / "db", pictures(2))
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        data_layer(source, transform, **data)


def test_crops_larger_than_the_resized_images_and_float_records_are_refused(tmp_path):
    source = write_encoded_db(tmp_path / "db", pictures(2))
    with pytest.raises(DataError, match=r"layer 'd' \(Data\): the crop 9x9 is larger than the images \(8x8 after "):
        data_layer(source, {"resize_param": {"height": 8, "width": 8}, "crop_h": 9, "crop_w": 9})
    with LMDBWriter(str(tmp_path / "floats")) as w:
        w.add(numpy.zeros((3, 4, 4), numpy.float32), 0)
    with pytest.raises(DataError, match="8-bit images; the records hold float32"):
        data_layer(str(tmp_path / "floats"), {"noise_param": {"inverse": True}})
