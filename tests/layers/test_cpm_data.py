"""CPMData, OpenPose's training data layer (CMU's caffe_train fork): genLMDB.py's records, the fork's augmentation
and its label maps, checked against the fork's loops written out cell by cell, against OpenCV, and by where each
body part's painted marker lands."""
import logging
import math

import cv2
import numpy
import pytest

from layerforge import rng
from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.caffe import caffe_pb
from layerforge.data.datum import array_to_datum
from layerforge.data.lmdb_io import LMDBWriter
from layerforge.data.pose import COCO, MPI, PoseTransform, body_parts, decode_meta, encode_meta
from layerforge.errors import ConfigError, DataError
from layerforge.layers import create_layer
from layerforge.schema import Context, validate_block
from layerforge.layers.cpm_data import CPM_TRANSFORM

FORK = "CMU-Perceptual-Computing-Lab/caffe_train"


def colour(k):
    """The marker colour of body part k (BGR), far from its neighbours'."""
    return ((37 * k + 20) % 256, (97 * k + 60) % 256, (151 * k + 200) % 256)


def coco_person(g, h, w, margin=12, spacing=0):
    """17 COCO joints (1-based x, y, visibility 1) spread over the picture, at least ``spacing`` pixels apart."""
    while True:
        xy = numpy.stack([g.uniform(margin, w - margin, 17), g.uniform(margin, h - margin, 17)], 1)
        d = numpy.hypot(*(xy[:, None] - xy[None]).transpose(2, 0, 1)) + numpy.eye(17) * 1e9
        # the neck is the shoulders' mean: it too keeps clear of the others
        neck = (xy[5] + xy[6]) / 2
        if d.min() >= spacing and numpy.hypot(*(xy - neck).T).min() >= spacing:
            break
    return numpy.concatenate([xy + 1, numpy.ones((17, 1))], 1)


def record(g, h=120, w=160, others=1, markers=False, mask_hole=True):
    """A genLMDB.py record (6, H, W) uint8: the picture, the metadata channel, mask_miss and mask_all. With
    ``markers`` the picture is grey with a 9 x 9 square of each body part's colour at the person's parts."""
    joints = coco_person(g, h, w, spacing=14 if markers else 0)
    people = [(tuple(g.uniform(20, w - 20, 2)), float(g.uniform(0.3, 0.6)), coco_person(g, h, w))
              for _ in range(others)]
    centre = joints[:, :2].mean(0)
    meta = encode_meta((h, w), "COCO", centre, float(g.uniform(0.4, 0.7)), joints, people, write_number=0,
                       total_write_number=4)
    if markers:
        picture = numpy.full((h, w, 3), 128, numpy.uint8)
        parts = (joints[numpy.array(COCO["parts"])[:, 0] - 1, :2] + joints[numpy.array(COCO["parts"])[:, 1] - 1, :2]) / 2
        for k, (x, y) in enumerate(parts - 1):
            x, y = int(round(x)), int(round(y))
            picture[y - 4:y + 5, x - 4:x + 5] = colour(k)
    else:
        picture = g.integers(0, 256, (h, w, 3)).astype(numpy.uint8)
    mask = numpy.full((h, w), 255, numpy.uint8)
    if mask_hole:
        mask[: h // 3, : w // 4] = 0
    return numpy.concatenate([picture.transpose(2, 0, 1), meta[None], mask[None], numpy.zeros((1, h, w), numpy.uint8)])


def write_db(path, records):
    with LMDBWriter(str(path)) as w:
        for r in records:
            w.put(array_to_datum(r).SerializeToString())
    return str(path)


def params(**keys):
    base = {"stride": 8, "crop_size_x": 96, "crop_size_y": 64, "num_parts": 56, "np_in_lmdb": 17,
            "max_rotate_degree": 40, "scale_prob": 1, "scale_min": 0.8, "scale_max": 1.2, "target_dist": 0.6,
            "center_perterb_max": 20, "sigma": 7}
    return dict(base, **keys)


def block(**keys):
    return validate_block(params(**keys), CPM_TRANSFORM, Context())


def layer_of(source, phase="TRAIN", xp=numpy, dtype=numpy.float64, transform=None, **data):
    data = dict({"source": source, "batch_size": 2, "decode_workers": 1}, **data)
    layer = create_layer({"name": "pose", "type": "CPMData", "top": ["data", "label"], "data": data,
                          "cpm_transform": transform or params()}, phase=phase, dtype=dtype, xp=xp)
    top = [Blob(xp=xp), Blob(xp=xp)]
    layer.setup([], top)
    return layer, top


def take(layer, top, count):
    try:
        out = []
        for _ in range(count):
            layer.forward([], top)
            out.append((to_numpy(top[0].data).copy(), to_numpy(top[1].data).copy()))
        return out
    finally:
        layer.close()


# ---------------------------------------------------------------------------------------------------------------
# the records


def test_metadata_reads_back_zero_based_with_the_forks_visibility_rules():
    g = numpy.random.default_rng(0)
    joints = coco_person(g, 50, 80)
    joints[0, 2], joints[1, 2], joints[2, 2] = 0, 2, 3  # occluded, "not labelled" (read as 1), the fork's 3
    joints[3, :2] = (90, 10)  # beyond the picture's width (80): 2
    other = coco_person(g, 50, 80)
    other[4, 2] = 3  # a 3 counts only for the person itself
    channel = encode_meta((50, 80), "COCO", (40.5, 20), 0.55, joints, [((10, 11), 0.25, other)], people_index=2,
                          annolist_index=7, write_number=3, total_write_number=9)
    meta = decode_meta(channel, 17)
    assert (meta.dataset, meta.height, meta.width, meta.people_index, meta.annolist_index, meta.write_number,
            meta.total_write_number) == ("COCO", 50.0, 80.0, 2, 7, 3, 9)
    assert meta.scale == pytest.approx(0.55) and meta.other_scales.tolist() == pytest.approx([0.25])
    numpy.testing.assert_allclose(meta.centres, [[39.5, 19], [9, 10]])
    numpy.testing.assert_allclose(meta.joints[0], joints[:, :2] - 1, rtol=1e-6)
    numpy.testing.assert_allclose(meta.joints[1], other[:, :2] - 1, rtol=1e-6)
    assert meta.visible[0, :5].tolist() == [0, 1, 3, 2, 1] and meta.visible[1, 4] == 1


def test_coco_parts_are_the_forks_18_with_the_neck_between_the_shoulders():
    g = numpy.random.default_rng(1)
    joints = coco_person(g, 60, 90)
    joints[5, 2] = 0  # left shoulder occluded: the neck is not "visible"
    joints[14] = (0, 0, 0)  # right knee (COCO's 15th joint) unlabelled, at 0 (1-based): outside, the part is 2
    meta = body_parts(decode_meta(encode_meta((60, 90), "COCO", (30, 30), 1.0, joints), 17), COCO)
    xy = joints[:, :2] - 1
    numpy.testing.assert_allclose(meta.joints[0, 1], (xy[5] + xy[6]) / 2, rtol=1e-6)  # neck
    numpy.testing.assert_allclose(meta.joints[0, [0, 2, 5, 15]], xy[[0, 6, 5, 1]], rtol=1e-6)
    assert meta.visible[0, 1] == 0 and meta.visible[0, 2] == 1 and meta.visible[0, 9] == 2
    assert meta.joints.shape == (1, 18, 2)


# ---------------------------------------------------------------------------------------------------------------
# the label maps, against the fork's loops written out cell by cell


def fork_label(mask_small, joints, visible, model, parts, stride, sigma):
    """generateLabelMap and the weights of Transform_nv as the fork's C++ loops them, one cell at a time."""
    grid_y, grid_x = mask_small.shape
    label = numpy.zeros((2 * (parts + 1), grid_y, grid_x))
    for y in range(grid_y):
        for x in range(grid_x):
            for i in range(parts):
                if i >= visible.shape[1] or visible[0, i] != 3:
                    label[i, y, x] = mask_small[y, x] / 255
            label[parts, y, x] = mask_small[y, x] / 255
    start = stride / 2.0 - 0.5
    heat0 = parts + model["heat"]
    for i in range(len(model["parts"])):
        for p in range(len(joints)):
            if visible[p, i] > 1:
                continue
            cx, cy = joints[p, i]
            for gy in range(grid_y):
                for gx in range(grid_x):
                    d2 = (start + gx * stride - cx) ** 2 + (start + gy * stride - cy) ** 2
                    e = d2 / 2.0 / sigma / sigma
                    if e > 4.6052:
                        continue
                    label[heat0 + i, gy, gx] = min(label[heat0 + i, gy, gx] + math.exp(-e), 1)
    for k, (a, b) in enumerate(model["limbs"]):
        for p in range(len(joints)):
            if visible[p, a - 1] > 1 or visible[p, b - 1] > 1:
                continue
            ax, ay = joints[p, a - 1] / stride
            bx, by = joints[p, b - 1] / stride
            n = math.hypot(bx - ax, by - ay)
            if n == 0:  # the fork divides 0 by 0: NaN, which no cell's distance test passes
                continue
            ux, uy = (bx - ax) / n, (by - ay) / n
            rnd = lambda v: math.floor(v + 0.5) if v >= 0 else -math.floor(-v + 0.5)  # noqa: E731
            for gy in range(max(rnd(min(ay, by) - 1), 0), min(rnd(max(ay, by) + 1), grid_y)):
                for gx in range(max(rnd(min(ax, bx) - 1), 0), min(rnd(max(ax, bx) + 1), grid_x)):
                    if abs((gx - ax) * uy - (gy - ay) * ux) <= 1:
                        label[parts + 1 + 2 * k, gy, gx], label[parts + 2 + 2 * k, gy, gx] = ux, uy
    for gy in range(grid_y):
        for gx in range(grid_x):
            label[2 * parts + 1, gy, gx] = max(1 - max(0, label[heat0:heat0 + len(model["parts"]), gy, gx].max()), 0)
    return label


@pytest.mark.parametrize("model_name, stride, size", [("COCO", 8, (64, 96)), ("COCO", 4, (40, 48)),
                                                      ("MPI", 8, (56, 72))])
def test_label_maps_equal_the_forks_loops(model_name, stride, size):
    model, parts = (COCO, 56) if model_name == "COCO" else (MPI, 43)
    g = numpy.random.default_rng(2)
    people, count = 3, len(model["parts"])
    joints = numpy.stack([g.uniform(-10, size[1] + 10, (people, count)), g.uniform(-10, size[0] + 10, (people, count))],
                         -1).astype(numpy.float32)
    visible = g.choice([0, 1, 1, 1, 2], (people, count))
    visible[0, 3] = 3
    joints[1, 2] = joints[1, 1]  # a limb of length 0: no direction, no field
    mask = numpy.full(size, 255, numpy.uint8)
    mask[: size[0] // 2, : size[1] // 3] = 0
    from types import SimpleNamespace
    meta = SimpleNamespace(joints=joints, visible=visible)
    t = block(stride=stride, sigma=9.0, num_parts=parts, np_in_lmdb=model["lmdb_joints"])
    label = PoseTransform(t, "TRAIN").label(mask, meta, size)
    small = cv2.resize(mask, None, fx=1 / stride, fy=1 / stride, interpolation=cv2.INTER_CUBIC)
    small = small[: size[0] // stride, : size[1] // stride]
    want = fork_label(small, joints.astype(numpy.float64), visible, model, parts, stride, 9.0)
    assert label.shape == (2 * (parts + 1), size[0] // stride, size[1] // stride) and label.dtype == numpy.float32
    numpy.testing.assert_allclose(label, want, atol=2e-6)
    heat0 = parts + model["heat"]
    assert label[heat0:heat0 + count].max() == 1.0 and label[3].max() == 0  # part 3 of the person itself is a 3
    fields = label[parts + 1:heat0].reshape(-1, 2, *label.shape[1:])
    norms = numpy.hypot(fields[:, 0], fields[:, 1])
    assert (norms > 0).sum() > 20 and numpy.allclose(norms[norms > 0], 1, atol=1e-6)  # unit vectors


def test_a_part_on_a_cell_centre_peaks_at_one_and_a_horizontal_limb_points_along_x():
    t = block(stride=8, sigma=8.0)
    from types import SimpleNamespace
    joints = numpy.zeros((1, 18, 2), numpy.float32)
    visible = numpy.full((1, 18), 2)
    joints[0, 1] = (3.5 + 8 * 4, 3.5 + 8 * 2)  # neck on cell (2, 4)'s centre
    joints[0, 2] = (3.5 + 8 * 9, 3.5 + 8 * 2)  # right shoulder 5 cells to the right
    visible[0, [1, 2]] = 1
    label = PoseTransform(t, "TRAIN").label(numpy.full((48, 96), 255, numpy.uint8),
                                            SimpleNamespace(joints=joints, visible=visible), (48, 96))
    neck = label[56 + 39 + 1]
    assert neck[2, 4] == 1.0 and neck[2, 5] == pytest.approx(math.exp(-64 / 128), rel=1e-6)
    assert neck[0, 4] == pytest.approx(math.exp(-256 / 128), rel=1e-6) and neck[2, 9] == 0  # beyond 1%
    fx, fy = label[56 + 1 + 2 * 6], label[56 + 2 + 2 * 6]  # limb 6: neck (2) -> right shoulder (3), 1-based
    # in cells the joints are at x 4.4375 and 9.4375, y 2.4375: the fork's window is x in [round(3.4375),
    # round(10.4375)) = [3, 10), y in [1, 3), and of those the cells within 1 of the line y = 2.4375: row 2
    assert numpy.argwhere(fx).tolist() == [[2, x] for x in range(3, 10)] and not fy.any()
    assert (fx[2, 3:10] == 1).all()
    assert label[113, 2, 4] == 0 and label[113, 5, 0] == 1  # background: 1 - the largest confidence


# ---------------------------------------------------------------------------------------------------------------
# the augmentation


def swapped(k):
    """The COCO part whose marker a flipped picture shows where part k's label is."""
    pairs = dict(zip(numpy.array(COCO["right"]) - 1, numpy.array(COCO["left"]) - 1))
    pairs.update({v: k2 for k2, v in pairs.items()})
    return pairs.get(k, k)


@pytest.mark.parametrize("seed", range(6))
def test_every_part_label_lands_on_its_marker_after_scale_rotation_crop_and_flip(seed):
    g = numpy.random.default_rng(seed)
    data = record(g, others=0, markers=True)
    t = block(crop_size_x=128, crop_size_y=112, flip_prob=0.5, max_rotate_degree=40, center_perterb_max=4,
              scale_min=0.9, scale_max=1.1, target_dist=float(decode_meta(data[3], 17).scale))
    image, label, meta, aug = PoseTransform(t, "TRAIN")(data, "rec", numpy.random.default_rng(seed))
    checked = 0
    for k in range(18):
        x, y = meta.joints[0, k]
        if meta.visible[0, k] > 1 or not (3 <= x < 125 and 3 <= y < 109):
            continue
        pixel = image[:, int(round(y)), int(round(x))].astype(int)
        want = numpy.array(colour(swapped(k) if aug.flip else k))
        assert numpy.abs(pixel - want).max() <= 40, (k, pixel, want, aug)
        cell = label[56 + 39 + k]
        gy, gx = numpy.unravel_index(cell.argmax(), cell.shape)
        assert abs(3.5 + 8 * gx - x) <= 4 and abs(3.5 + 8 * gy - y) <= 4  # the peak is the part's cell
        checked += 1
    assert checked >= 8


def test_train_with_no_randomness_is_opencvs_resize_and_a_crop_around_the_person():
    g = numpy.random.default_rng(4)
    data = record(g)
    meta = decode_meta(data[3], 17)
    t = block(scale_prob=0, max_rotate_degree=0, center_perterb_max=0, flip_prob=0, crop_size_x=64, crop_size_y=48)
    image, label, out, aug = PoseTransform(t, "TRAIN")(data, "rec", numpy.random.default_rng(0))
    assert (aug.scale, aug.degree, aug.shift, aug.flip) == (1.0, 0.0, (0, 0), False)
    scale = float(numpy.float32(0.6 / meta.scale))
    resized = cv2.resize(data[:3].transpose(1, 2, 0), None, fx=scale, fy=scale, interpolation=cv2.INTER_CUBIC)
    # a rotation of 0 degrees still goes through warpAffine: the fork's bounding box is one pixel larger, so the
    # picture moves by half a pixel (cubic interpolation)
    h, w = resized.shape[:2]
    moved = cv2.warpAffine(resized, numpy.array([[1, 0, 0.5], [0, 1, 0.5]]), (w + 1, h + 1), flags=cv2.INTER_CUBIC,
                           borderMode=cv2.BORDER_CONSTANT, borderValue=(128, 128, 128))
    cx, cy = numpy.rint(meta.centres[0] * numpy.float32(scale) + 0.5).astype(int)
    window = numpy.full((48, 64, 3), 128, numpy.uint8)
    top, left = cy - 24, cx - 32
    y0, x0, y1, x1 = max(top, 0), max(left, 0), min(top + 48, h + 1), min(left + 64, w + 1)
    window[y0 - top:y1 - top, x0 - left:x1 - left] = moved[y0:y1, x0:x1]
    numpy.testing.assert_array_equal(image.transpose(1, 2, 0), window)
    numpy.testing.assert_allclose(out.joints[0, 0], meta.joints[0, 0] * numpy.float32(scale) + 0.5 - [left, top],
                                  atol=1e-3)


def test_test_phase_keeps_the_picture_and_weighs_by_the_mask(tmp_path, xp):
    g = numpy.random.default_rng(5)
    records = [record(g) for _ in range(3)]
    layer, top = layer_of(write_db(tmp_path / "db", records), phase="TEST", xp=xp)
    assert top[0].shape == (2, 6, 120, 160) and top[1].shape == (2, 114, 15, 20)
    (data, label), = take(layer, top, 1)
    for i in range(2):
        numpy.testing.assert_array_equal(data[i, :3], (records[i][:3].astype(numpy.float64) - 128) / 256)
        assert not data[i, 3:].any()
        small = cv2.resize(records[i][4], None, fx=1 / 8, fy=1 / 8, interpolation=cv2.INTER_CUBIC) / 255
        numpy.testing.assert_allclose(label[i, :57], numpy.broadcast_to(small, (57, 15, 20)), rtol=1e-6)
        assert label[i, 0, 0, 0] == 0 and label[i, 0, -1, -1] == 1


def test_train_batches_are_a_function_of_the_seed_and_position(tmp_path, xp):
    """The same batches with 1 and 2 decode workers, on numpy and the device, and again from a restored state."""
    g = numpy.random.default_rng(6)
    source = write_db(tmp_path / "db", [record(g) for _ in range(5)])
    runs = []
    for workers, backend in ((1, numpy), (2, numpy), (1, xp)):
        rng.seed(3)
        layer, top = layer_of(source, xp=backend, decode_workers=workers)
        assert top[0].shape == (2, 6, 64, 96) and top[1].shape == (2, 114, 8, 12)
        runs.append(take(layer, top, 3))
    for run in runs[1:]:
        for (d0, l0), (d1, l1) in zip(runs[0], run):
            numpy.testing.assert_array_equal(d0, d1)
            numpy.testing.assert_array_equal(l0, l1)
    rng.seed(3)
    layer, top = layer_of(source)
    take(layer, top, 1)
    state = layer.get_state()
    rng.seed(99)
    again, top = layer_of(source)
    again.set_state(state)
    for (d0, l0), (d1, l1) in zip(runs[0][1:], take(again, top, 2)):
        numpy.testing.assert_array_equal(d0, d1)
        numpy.testing.assert_array_equal(l0, l1)
    assert any(not numpy.array_equal(a[0], b[0]) for a, b in zip(runs[0], runs[0][1:]))


def test_aug_way_table_reads_the_forks_rotation_and_flip_files(tmp_path, monkeypatch):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    (tmp_path / "rotate_3_4.txt").write_text("\n".join(["0 15 -30"] * 4))
    (tmp_path / "flip_3_4.txt").write_text("\n".join(["1 0 1"] * 4))
    data = record(numpy.random.default_rng(7))
    t = block(aug_way="table", num_total_augs=3)
    transform = PoseTransform(t, "TRAIN")
    seen = [transform(data, "rec", numpy.random.default_rng(0), epoch) for epoch in range(4)]
    assert [(a.degree, a.flip) for *_, a in seen] == [(0, True), (15, False), (-30, True), (0, True)]
    (tmp_path / "rotate_3_4.txt").unlink()
    with pytest.raises(DataError, match=r"rotate_3_4.txt: the rotate table"):
        PoseTransform(t, "TRAIN")(data, "rec", numpy.random.default_rng(0))


def test_visualize_writes_the_forks_pictures(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = record(numpy.random.default_rng(8))
    source = write_db(tmp_path / "db", [data])
    layer, top = layer_of(source, batch_size=1, prefetch=0, transform=params(visualize=True))
    take(layer, top, 1)
    names = sorted(p.name for p in tmp_path.glob("augment_*.jpg"))
    assert names[0] == "augment_0000_epoch_000_writenum_000.jpg"
    assert names[1:] == sorted(f"augment_0000_label_part_{k:02d}.jpg" for k in range(114))
    assert cv2.imread(str(tmp_path / names[0])).shape == (64, 96, 3)


# ---------------------------------------------------------------------------------------------------------------
# bad input and the fork's prototxt


def test_records_that_are_no_pose_records_are_refused_in_one_line(tmp_path):
    g = numpy.random.default_rng(9)
    source = write_db(tmp_path / "rgb", [g.integers(0, 255, (3, 20, 30)).astype(numpy.uint8)])
    with pytest.raises(DataError, match=r"layer 'pose' \(CPMData\): .*0000000.*5 or 6 channels"):
        layer_of(source)
    tiny = record(g, h=30, w=160)[:, :8]  # 8 rows: the metadata of a person and another needs 12
    with pytest.raises(DataError, match=r"needs row 8, the picture has 8 rows"):
        layer_of(write_db(tmp_path / "tiny", [tiny]))
    mixed = write_db(tmp_path / "mixed", [record(g), record(g, h=100)])
    layer, top = layer_of(mixed, phase="TEST")
    with pytest.raises(DataError, match=r"0000001.*differs from the first record's"):
        take(layer, top, 1)


@pytest.mark.parametrize("key, value, message", [
    ("num_parts", 14, "num_parts 14: the fork's label maps are made for 56"),
    ("np_in_lmdb", 16, "np_in_lmdb 16: num_parts 56 is made from 17"),
    ("aug_way", "random", "aug_way 'random'"),
    ("crop_size", 368, "crop_size is not CPMData's crop"),
    ("crop_size_x", 4, "crop_size_x 4 is smaller than stride 8")])
def test_bad_parameters_name_their_key(tmp_path, key, value, message):
    source = write_db(tmp_path / "db", [record(numpy.random.default_rng(0))])
    with pytest.raises(ConfigError, match=message) as e:
        layer_of(source, transform=params(**{key: value}))
    assert e.value.key == f"cpm_transform.{key}"


def test_keys_the_fork_does_not_read_are_reported(tmp_path, caplog):
    source = write_db(tmp_path / "db", [record(numpy.random.default_rng(0))])
    with caplog.at_level(logging.WARNING, "layerforge"):
        layer, _ = layer_of(source, transform=params(mean_value=[128], mirror=True))
    assert "cpm_transform.mirror has no effect" in caplog.text and "cpm_transform.mean_value" in caplog.text


def test_the_fork_proto_knows_cpm_transform_param():
    assert caffe_pb.fork_of("CPMTransformationParameter") == ["openpose"]
    assert caffe_pb.forks_of_layer_type("CPMData") == ["openpose"]
    assert caffe_pb.FORKS["openpose"].startswith(FORK)
    p = caffe_pb.CPMTransformationParameter()
    assert (p.crop_size_x, p.stride, p.np_in_lmdb, p.aug_way, p.sigma) == (368, 4, 16, "rand", 7.0)
    clashes = {(fork, field[0]): other[0] for fork, message, field, other in caffe_pb.CLASHES}
    assert clashes[("openpose", "cpm_transform_param")] == "swish_param"


POSE_TRAIN = """name: "pose_like"
layer { name: "data" type: "CPMData" top: "data" top: "label"
  data_param { source: "SOURCE" batch_size: 4 backend: LMDB }
  cpm_transform_param { stride: 8 max_rotate_degree: 40 visualize: false crop_size_x: 64 crop_size_y: 48
    scale_prob: 1 scale_min: 0.5 scale_max: 1.1 target_dist: 0.6 center_perterb_max: 10 do_clahe: false
    num_parts: 56 np_in_lmdb: 17 } }
layer { name: "vec_weight" type: "Slice" bottom: "label" top: "vec_weight" top: "heat_weight" top: "vec_temp"
  top: "heat_temp" slice_param { slice_point: 38 slice_point: 57 slice_point: 95 axis: 1 } }
layer { name: "label_vec" type: "Eltwise" bottom: "vec_weight" bottom: "vec_temp" top: "label_vec"
  eltwise_param { operation: PROD } }
layer { name: "label_heat" type: "Eltwise" bottom: "heat_weight" bottom: "heat_temp" top: "label_heat"
  eltwise_param { operation: PROD } }
layer { name: "image" type: "Slice" bottom: "data" top: "image" top: "center_map" slice_param { slice_point: 3 axis: 1 } }
layer { name: "silence2" type: "Silence" bottom: "center_map" }
""" + "".join(f"""layer {{ name: "conv{k}" type: "Convolution" bottom: "{'image' if k == 1 else f'pool{k - 1}'}" top: "conv{k}"
  param {{ lr_mult: 1 decay_mult: 1 }} param {{ lr_mult: 2 decay_mult: 0 }}
  convolution_param {{ num_output: 16 pad: 1 kernel_size: 3 weight_filler {{ type: "gaussian" std: 0.1 }}
    bias_filler {{ type: "constant" }} }} }}
layer {{ name: "relu{k}" type: "ReLU" bottom: "conv{k}" top: "conv{k}" }}
layer {{ name: "pool{k}" type: "Pooling" bottom: "conv{k}" top: "pool{k}" pooling_param {{ pool: MAX kernel_size: 2 stride: 2 }} }}
""" for k in (1, 2, 3)) + "".join(f"""layer {{ name: "L{b}" type: "Convolution" bottom: "pool3" top: "L{b}"
  convolution_param {{ num_output: {n} pad: 1 kernel_size: 3 weight_filler {{ type: "gaussian" std: 0.01 }}
    bias_filler {{ type: "constant" }} }} }}
layer {{ name: "weight_stage1_L{b}" type: "Eltwise" bottom: "L{b}" bottom: "{w}" top: "weight_stage1_L{b}"
  eltwise_param {{ operation: PROD }} }}
layer {{ name: "loss_stage1_L{b}" type: "EuclideanLoss" bottom: "weight_stage1_L{b}" bottom: "{label}"
  top: "loss_stage1_L{b}" loss_weight: 1 }}
""" for b, n, w, label in ((1, 38, "vec_weight", "label_vec"), (2, 19, "heat_weight", "label_heat")))


def test_an_openpose_training_net_learns_through_pycaffe(tmp_path):
    """OpenPose's training prototxt as the fork's setLayers.py writes it (CPMData, the label sliced into weights
    and maps, the weighted Euclidean losses of both branches), narrow, trained by pycaffe's SGDSolver on a
    genLMDB.py-style LMDB of pictures with each part painted: the confidence maps are learnt (the loss falls to
    about half of what predicting 0 leaves, batch by batch), and the weighting is the fork's."""
    import layerforge.pycaffe as caffe

    g = numpy.random.default_rng(10)
    source = write_db(tmp_path / "lmdb", [record(g, others=0, markers=True) for _ in range(8)])
    (tmp_path / "train.prototxt").write_text(POSE_TRAIN.replace("SOURCE", source))
    (tmp_path / "solver.prototxt").write_text(f'train_net: "{tmp_path / "train.prototxt"}"\nbase_lr: 0.01\n'
                                              'momentum: 0.9\nlr_policy: "fixed"\ndisplay: 0\nrandom_seed: 5\n'
                                              'weight_decay: 0.0005\n')
    caffe.set_mode_cpu()
    solver = caffe.SGDSolver(str(tmp_path / "solver.prototxt"))
    blobs = solver.net.blobs
    assert blobs["label"].data.shape == (4, 114, 6, 8) and blobs["image"].data.shape == (4, 3, 48, 64)

    def left(branch, label):  # the loss against what predicting 0 would leave on this batch
        return float(blobs[f"loss_stage1_L{branch}"].data) / ((blobs[label].data ** 2).sum() / 8)

    solver.step(1)
    assert left(2, "label_heat") == pytest.approx(1, abs=0.05)  # the outputs start near 0
    ratios = []
    for _ in range(14):
        solver.step(5)
        ratios.append((left(1, "label_vec"), left(2, "label_heat")))
    assert numpy.mean([r[1] for r in ratios[-6:]]) < 0.65, ratios
    assert max(r[0] for r in ratios) < 1.5, ratios  # the affinity fields: this net is too small to learn them
    numpy.testing.assert_array_equal(blobs["label_heat"].data, blobs["heat_weight"].data * blobs["heat_temp"].data)
    numpy.testing.assert_array_equal(blobs["heat_weight"].data, blobs["label"].data[:, 38:57])


def test_the_forks_prototxt_converts_reading_in_key_order(tmp_path):
    from layerforge.solvers.caffe_import import convert_file

    (tmp_path / "net.prototxt").write_text(POSE_TRAIN.replace("SOURCE", "lmdb_trainVal"))
    kind, netdef, _ = convert_file(str(tmp_path / "net.prototxt"))
    data = netdef["layers"][0]
    assert kind == "net" and data["type"] == "CPMData"
    assert data["data"]["shuffle"] is False  # the fork reads its LMDB in key order, as Caffe's Data layer
    assert data["cpm_transform"]["num_parts"] == 56 and data["cpm_transform"]["crop_size_x"] == 64
