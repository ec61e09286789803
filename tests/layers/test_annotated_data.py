"""AnnotatedData: the SSD fork's test_annotated_data_layer.cpp (read, reshape, crops, seeded sequences), its records
against the fork's wire format, the boxes following the augmentation, and batches that do not depend on the
number of decode workers."""
import os

import numpy
import pytest

from layerforge import rng
from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.caffe import caffe_pb
from layerforge.data.annotations import annotated_record, decode_annotated
from layerforge.data.datum import array_to_datum
from layerforge.data.lmdb_io import write_lmdb_atomic
from layerforge.errors import ConfigError, DataError
from layerforge.layers import create_layer

NUM, CHANNELS, HEIGHT, WIDTH = 6, 2, 10, 10


def fork_box(g, a, unique_annotation):
    b = a if unique_annotation else g
    return [b * 0.1, b * 0.1, min(b * 0.1 + 0.2, 1.0), min(b * 0.1 + 0.2, 1.0)]


def fill(path, unique_pixel, unique_annotation, rich, shapes=None):
    """The fork's Fill: record i has i groups (group g of g boxes) or, without rich annotation, label i; keys
    '0' .. '5' (shapes (h, w) per record for TestReshape, pixels 0, 1, 2, ...)."""
    records = []
    for i in range(NUM):
        h, w = shapes[i] if shapes else (HEIGHT, WIDTH)
        size = CHANNELS * h * w
        values = numpy.arange(size) if (unique_pixel or shapes) else numpy.full(size, i)
        anno = caffe_pb.AnnotatedDatum()
        anno.datum.CopyFrom(array_to_datum(values.astype(numpy.uint8).reshape(CHANNELS, h, w), None))
        if rich:
            anno.type = caffe_pb.AnnotatedDatum.BBOX
            for g in range(i):
                group = anno.annotation_group.add(group_label=g)
                for a in range(g):
                    box = group.annotation.add(instance_id=a).bbox
                    box.xmin, box.ymin, box.xmax, box.ymax = fork_box(g, a, unique_annotation)
                    box.difficult = bool(a % 2)
        else:
            anno.datum.label = i
        records.append((str(i).encode(), anno.SerializeToString()))
    write_lmdb_atomic(str(path), records)
    return str(path)


def layer(source, phase="TRAIN", batch=NUM, transform=None, annotated=None, xp=numpy, **data):
    definition = {"type": "AnnotatedData", "top": ["data", "label"],
                  "data": dict({"source": source, "batch_size": batch, "shuffle": False, "decode_workers": 1,
                                "prefetch": 1}, **data),
                  "transform": transform or {}, "annotated_data": annotated or {}}
    lay = create_layer(definition, phase=phase, dtype=numpy.float64, xp=xp)
    top = [Blob((1,), numpy.float64, xp), Blob((1,), numpy.float64, xp)]
    lay.setup([], top)
    return lay, top


def fork_rows(i, unique_annotation, image=None):
    """The label rows of record i, as the fork's TestRead expects them."""
    return [[i if image is None else image, g, a] + fork_box(g, a, unique_annotation) + [a % 2]
            for g in range(i) for a in range(g)]


@pytest.mark.parametrize("unique_pixel", [False, True])
@pytest.mark.parametrize("unique_annotation", [False, True])
def test_read(tmp_path, unique_pixel, unique_annotation, xp):
    source = fill(tmp_path / "db", unique_pixel, unique_annotation, True)
    lay, top = layer(source, transform={"scale": 3}, xp=xp)
    assert top[0].shape == (NUM, CHANNELS, HEIGHT, WIDTH) and top[1].shape == (1, 1, 1, 8)
    expected = [row for i in range(NUM) for row in fork_rows(i, unique_annotation)]
    for _ in range(3):  # batches wrap around the six records
        lay.forward([], top)
        assert top[1].shape == (1, 1, len(expected), 8)
        numpy.testing.assert_allclose(to_numpy(top[1].data).reshape(-1, 8), expected, atol=1e-6)
        data = to_numpy(top[0].data).reshape(NUM, -1)
        for i in range(NUM):
            numpy.testing.assert_array_equal(data[i], 3 * (numpy.arange(data.shape[1]) if unique_pixel else i))
    lay.close()


def test_read_labels_without_rich_annotation(tmp_path, xp):
    lay, top = layer(fill(tmp_path / "db", True, False, False), xp=xp)
    assert top[1].shape == (NUM,)
    lay.forward([], top)
    numpy.testing.assert_array_equal(to_numpy(top[1].data), numpy.arange(NUM))
    lay.close()


@pytest.mark.parametrize("unique_annotation", [False, True])
def test_reshape(tmp_path, unique_annotation):
    """TestReshape: records of shapes (i % 2 + 1) x (i % 4 + 1), batch 1: each batch takes its image's shape, and
    the label is one row of -1 for the first two (no boxes)."""
    source = fill(tmp_path / "db", True, unique_annotation, True, [(i % 2 + 1, i % 4 + 1) for i in range(NUM)])
    lay, top = layer(source, phase="TEST", batch=1)
    assert top[1].shape == (1, 1, 1, 8)
    for it in range(3):
        lay.forward([], top)
        assert top[0].shape == (1, CHANNELS, it % 2 + 1, it % 4 + 1)
        numpy.testing.assert_array_equal(to_numpy(top[0].data).reshape(-1), numpy.arange(top[0].count))
        rows = to_numpy(top[1].data).reshape(-1, 8)
        if it <= 1:
            numpy.testing.assert_array_equal(rows, -numpy.ones((1, 8)))
        else:
            numpy.testing.assert_allclose(rows, fork_rows(it, unique_annotation, image=0), atol=1e-6)
    lay.close()


@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
def test_read_crop(tmp_path, phase):
    """TestReadCrop: crop_size 1; TEST always takes the centre pixel, TRAIN not always."""
    rng.seed(1701)
    lay, top = layer(fill(tmp_path / "db", True, False, False), phase=phase, transform={"scale": 3, "crop_size": 1})
    assert top[0].shape == (NUM, CHANNELS, 1, 1) and top[1].shape == (NUM,)
    centre = [3 * (4 * WIDTH + 4 + j * HEIGHT * WIDTH) for j in range(CHANNELS)]
    hits = 0
    for _ in range(5):
        lay.forward([], top)
        numpy.testing.assert_array_equal(to_numpy(top[1].data), numpy.arange(NUM))
        data = to_numpy(top[0].data).reshape(NUM, CHANNELS)
        hits += int((data == centre).sum())
        if phase == "TEST":
            numpy.testing.assert_array_equal(data, [centre] * NUM)
    if phase == "TRAIN":
        assert hits < 5 * NUM * CHANNELS
    lay.close()


def crop_sequence(source, seed, workers=1):
    rng.seed(seed)
    lay, top = layer(source, transform={"crop_size": 1, "mirror": True}, decode_workers=workers)
    out = []
    for _ in range(2):
        lay.forward([], top)
        out.append(to_numpy(top[0].data).copy())
    lay.close()
    return out


def test_crop_sequence_seeded_and_unseeded(tmp_path):
    """TestReadCropTrainSequenceSeeded / Unseeded: one seed gives one sequence; another seed another."""
    source = fill(tmp_path / "db", True, False, False)
    first, again, other = crop_sequence(source, 1701), crop_sequence(source, 1701), crop_sequence(source, 1702)
    for a, b, c in zip(first, again, other):
        numpy.testing.assert_array_equal(a, b)
        assert (a != c).any()


SSD_TRANSFORM = {
    "mirror": True, "mean_value": [10, 20, 30],
    "resize_param": {"resize_mode": "WARP", "height": 40, "width": 40, "interp_mode": ["LINEAR", "AREA", "NEAREST"]},
    "emit_constraint": {"emit_type": "CENTER"},
    "distort_param": {"brightness_prob": 0.5, "brightness_delta": 32, "contrast_prob": 0.5, "contrast_lower": 0.5,
                      "contrast_upper": 1.5, "hue_prob": 0.5, "hue_delta": 18, "saturation_prob": 0.5,
                      "saturation_lower": 0.5, "saturation_upper": 1.5, "random_order_prob": 0.3},
    "expand_param": {"prob": 0.5, "max_expand_ratio": 3.0},
}
SAMPLERS = [{"max_sample": 1, "max_trials": 1}] + [
    {"sampler": {"min_scale": 0.3, "max_scale": 1.0, "min_aspect_ratio": 0.5, "max_aspect_ratio": 2.0},
     "sample_constraint": {"min_jaccard_overlap": t}, "max_sample": 1, "max_trials": 50} for t in (0.1, 0.5, 0.9)]


def scenes(path, count=8, encoded=True):
    """Grey images (100 x 80) with one white rectangle each and its box: the boxes the layer writes must frame
    bright pixels whatever the augmentation did."""
    import cv2
    r = numpy.random.default_rng(0)
    records = []
    for k in range(count):
        image = numpy.full((80, 100, 3), 60, numpy.uint8)
        x0, y0 = int(r.integers(0, 60)), int(r.integers(0, 40))
        w, h = int(r.integers(20, 40)), int(r.integers(20, 40))
        image[y0:y0 + h, x0:x0 + w] = 250
        boxes = numpy.array([[1, 0, x0 / 100, y0 / 80, (x0 + w) / 100, (y0 + h) / 80, 0]], numpy.float32)
        datum = array_to_datum(image.transpose(2, 0, 1), None)
        if encoded:
            datum = caffe_pb.Datum(data=cv2.imencode(".png", image)[1].tobytes(), encoded=True, channels=3,
                                   height=80, width=100)
        records.append(annotated_record(datum, boxes))
    write_lmdb_atomic(str(path), records)
    return str(path)


def test_boxes_follow_the_augmentation(tmp_path):
    """Every box of every augmented batch frames the bright rectangle: its inner part is bright (the distortion
    changes brightness, so bright means well above the background's mean-subtracted level)."""
    lay, top = layer(scenes(tmp_path / "db"), batch=8, transform=SSD_TRANSFORM, annotated={"batch_sampler": SAMPLERS})
    checked = 0
    for _ in range(6):
        lay.forward([], top)
        images = to_numpy(top[0].data) + numpy.array([10, 20, 30])[:, None, None]
        for row in to_numpy(top[1].data).reshape(-1, 8):
            if row[0] < 0:
                continue
            image = images[int(row[0])].mean(axis=0)
            x0, y0, x1, y1 = (row[3:7] * 40).round().astype(int)
            inner = image[y0 + 2:y1 - 2, x0 + 2:x1 - 2]
            if inner.size:
                outside = numpy.ones(image.shape, bool)
                outside[max(0, y0 - 2):y1 + 2, max(0, x0 - 2):x1 + 2] = False
                if outside.any():
                    assert inner.mean() > image[outside].mean() + 40
                checked += 1
    assert checked > 20
    lay.close()


def test_batches_do_not_depend_on_the_workers(tmp_path):
    """The same seed gives the same bits with 1 and 3 decode workers, through the whole augmentation."""
    source = scenes(tmp_path / "db")
    outs = []
    for workers in (1, 3):
        rng.seed(7)
        lay, top = layer(source, batch=8, transform=SSD_TRANSFORM, annotated={"batch_sampler": SAMPLERS},
                         decode_workers=workers, shuffle=True)
        batches = []
        for _ in range(3):
            lay.forward([], top)
            batches.append((to_numpy(top[0].data).copy(), to_numpy(top[1].data).copy()))
        lay.close()
        outs.append(batches)
    for (a_data, a_label), (b_data, b_label) in zip(*outs):
        numpy.testing.assert_array_equal(a_data, b_data)
        numpy.testing.assert_array_equal(a_label, b_label)


def test_fit_large_size_and_pad_keeps_the_box_on_its_pixels(tmp_path):
    transform = {"resize_param": {"resize_mode": "FIT_LARGE_SIZE_AND_PAD", "height": 40, "width": 40,
                                  "pad_value": [0]}}
    lay, top = layer(scenes(tmp_path / "db", 2, encoded=False), phase="TEST", batch=2, transform=transform)
    lay.forward([], top)
    for row in to_numpy(top[1].data).reshape(-1, 8):
        image = to_numpy(top[0].data)[int(row[0])].mean(axis=0)
        x0, y0, x1, y1 = (row[3:7] * 40).round().astype(int)
        assert image[y0 + 1:y1 - 1, x0 + 1:x1 - 1].min() > 200
        assert image[:4].max() == 0  # the padding of a 100 x 80 image in a 40 x 40 square: 4 rows above
    lay.close()


def test_fork_wire_format(tmp_path):
    """An AnnotatedDatum as the fork's C++ serializes it (fields in number order; written out by hand here from
    the fork's caffe.proto numbers) reads exactly, and layerforge writes the same bytes (but for Datum.encoded,
    which the fork's CVMatToDatum sets to false explicitly and layerforge leaves unset: false either way)."""
    def varint(n):
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)

    def field(number, wire, payload):
        key = varint(number << 3 | wire)
        return key + (varint(len(payload)) + payload if wire == 2 else payload)

    f32 = lambda x: numpy.float32(x).tobytes()  # noqa: E731
    pixels = bytes(range(12))
    datum = field(1, 0, varint(3)) + field(2, 0, varint(2)) + field(3, 0, varint(2)) + field(4, 2, pixels) + \
        field(5, 0, varint(0))
    bbox = (field(1, 5, f32(0.1)) + field(2, 5, f32(0.2)) + field(3, 5, f32(0.5)) + field(4, 5, f32(0.75)) +
            field(6, 0, varint(1)))
    annotation = field(1, 0, varint(0)) + field(2, 2, bbox)
    group = field(1, 0, varint(7)) + field(2, 2, annotation)
    record = field(1, 2, datum) + field(2, 0, varint(0)) + field(3, 2, group)
    forks = field(1, 2, datum + field(7, 0, varint(0))) + field(2, 0, varint(0)) + field(3, 2, group)

    image, boxes, label, typed = decode_annotated(forks)
    assert typed and label == 0
    numpy.testing.assert_array_equal(image.reshape(-1), numpy.arange(12))
    numpy.testing.assert_array_equal(boxes, numpy.float32([[7, 0, 0.1, 0.2, 0.5, 0.75, 1]]))
    written = annotated_record(array_to_datum(numpy.arange(12, dtype=numpy.uint8).reshape(3, 2, 2), 0), boxes)
    assert written == record


def test_bad_records_and_options(tmp_path):
    plain = tmp_path / "plain"
    write_lmdb_atomic(str(plain), [array_to_datum(numpy.zeros((1, 2, 2), numpy.uint8), 1).SerializeToString()])
    with pytest.raises(DataError, match="not an AnnotatedDatum record"):
        layer(str(plain))
    with pytest.raises(ConfigError, match="FIT_SMALL_SIZE .* needs batch_size 1"):
        layer(str(plain), batch=2, transform={"resize_param": {"resize_mode": "FIT_SMALL_SIZE", "height": 4,
                                                               "width": 4}})
    with pytest.raises(ConfigError, match="unknown interp_mode 'BILINEAR'"):
        layer(str(plain), transform={"resize_param": {"height": 4, "width": 4, "interp_mode": "BILINEAR"}})
    with pytest.raises(ConfigError, match="min_scale <= max_scale"):
        layer(str(plain), annotated={"batch_sampler": {"sampler": {"min_scale": 0.5, "max_scale": 0.3}}})
    assert os.path.isdir(plain)
