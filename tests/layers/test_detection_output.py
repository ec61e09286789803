"""DetectionOutput (SSD's fork) on the vectors of the fork's test_detection_output_layer.cpp: 2 images, 4 priors
of a 2x2 grid, 2 classes, NMS threshold 0.1."""
import json
import logging
import re

import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import ConfigError, ShapeError
from layerforge.layers import create_layer

NUM, PRIORS, CLASSES = 2, 4, 2


def bottoms(share_location, xp):
    priors = []
    for h in range(2):
        for w in range(2):
            cx, cy = (w + 0.5) * 0.5, (h + 0.5) * 0.5
            priors += [cx - 0.15, cy - 0.15, cx + 0.15, cy + 0.15]
    prior = numpy.array([priors, [0.1] * 16]).reshape(1, 2, 16, 1)
    conf = numpy.array([[j * 0.2 if i % 2 == c % 2 else 1 - j * 0.2 for j in range(PRIORS) for c in range(CLASSES)]
                        for i in range(NUM)])
    loc_classes = 1 if share_location else CLASSES
    loc = numpy.array([[(-1 if s % 2 else 1) * (i + c / 2 + 0.5)
                        for h in range(2) for w in range(2) for c in range(loc_classes) for s in (w, h, w, h)]
                       for i in range(NUM)])
    blobs = []
    for a in (loc, conf, prior):
        b = Blob(a.shape, numpy.float32, xp)
        b.data[...] = xp.asarray(a)
        blobs.append(b)
    return blobs


def detect(xp, share_location=True, background=0, top_k=None, **extra):
    nms = {"nms_threshold": 0.1} if top_k is None else {"nms_threshold": 0.1, "top_k": top_k}
    block = dict({"num_classes": CLASSES, "share_location": share_location, "background_label_id": background,
                  "nms_param": nms}, **extra)
    layer = create_layer({"type": "DetectionOutput", "bottom": ["loc", "conf", "prior"], "top": "det",
                          "detection_output": block}, dtype=numpy.float32, xp=xp)
    bottom, top = bottoms(share_location, xp), Blob((), numpy.float32, xp)
    layer.setup(bottom, [top])
    assert top.shape == (1, 1, 1, 7)
    layer.forward(bottom, [top])
    return to_numpy(top.data)


def check(top, rows):
    expected = numpy.array([[float(v) for v in row.split()] for row in rows])
    assert top.shape == (1, 1, len(rows), 7)
    numpy.testing.assert_array_equal(top[0, 0, :, :2], expected[:, :2])
    numpy.testing.assert_allclose(top[0, 0, :, 2:], expected[:, 2:], atol=1e-6)


def test_share_location(xp):
    check(detect(xp), ["0 1 1.0 0.15 0.15 0.45 0.45", "0 1 0.8 0.55 0.15 0.85 0.45", "0 1 0.6 0.15 0.55 0.45 0.85",
                       "0 1 0.4 0.55 0.55 0.85 0.85", "1 1 0.6 0.45 0.45 0.75 0.75", "1 1 0.0 0.25 0.25 0.55 0.55"])


def test_share_location_top_k(xp):
    check(detect(xp, top_k=2), ["0 1 1.0 0.15 0.15 0.45 0.45", "0 1 0.8 0.55 0.15 0.85 0.45",
                                "1 1 0.6 0.45 0.45 0.75 0.75"])


NO_SHARE = ["0 0 0.6 0.55 0.55 0.85 0.85", "0 0 0.4 0.15 0.55 0.45 0.85", "0 0 0.2 0.55 0.15 0.85 0.45",
            "0 0 0.0 0.15 0.15 0.45 0.45", "0 1 1.0 0.20 0.20 0.50 0.50", "0 1 0.8 0.50 0.20 0.80 0.50",
            "0 1 0.6 0.20 0.50 0.50 0.80", "0 1 0.4 0.50 0.50 0.80 0.80", "1 0 1.0 0.25 0.25 0.55 0.55",
            "1 0 0.4 0.45 0.45 0.75 0.75", "1 1 0.6 0.40 0.40 0.70 0.70"]


def test_no_share_location(xp):
    check(detect(xp, share_location=False, background=-1), NO_SHARE)


def test_no_share_location_top_k(xp):
    check(detect(xp, share_location=False, background=-1, top_k=2),
          [NO_SHARE[i] for i in (0, 1, 4, 5, 8, 10)])


def test_no_share_location_background_0(xp):
    check(detect(xp, share_location=False), NO_SHARE[4:8] + NO_SHARE[10:])


def test_no_share_location_background_0_top_k(xp):
    check(detect(xp, share_location=False, top_k=2), [NO_SHARE[i] for i in (4, 5, 10)])


def test_keep_top_k_and_confidence_threshold(xp):
    # the share_location case keeps 6; keep_top_k 3 keeps each image's best 3, the threshold drops score 0.0
    check(detect(xp, keep_top_k=3), ["0 1 1.0 0.15 0.15 0.45 0.45", "0 1 0.8 0.55 0.15 0.85 0.45",
                                     "0 1 0.6 0.15 0.55 0.45 0.85", "1 1 0.6 0.45 0.45 0.75 0.75",
                                     "1 1 0.0 0.25 0.25 0.55 0.55"])
    check(detect(xp, confidence_threshold=0.5), ["0 1 1.0 0.15 0.15 0.45 0.45", "0 1 0.8 0.55 0.15 0.85 0.45",
                                                 "0 1 0.6 0.15 0.55 0.45 0.85", "1 1 0.6 0.45 0.45 0.75 0.75"])


def test_a_fourth_bottom_the_image_is_accepted():
    layer = create_layer({"type": "DetectionOutput", "bottom": ["loc", "conf", "prior", "image"], "top": "det",
                          "detection_output": {"num_classes": CLASSES, "nms_param": {"nms_threshold": 0.1}}})
    bottom, top = bottoms(True, numpy) + [Blob((2, 3, 8, 8))], Blob(())
    layer.setup(bottom, [top])
    layer.forward(bottom, [top])
    check(top.data, ["0 1 1.0 0.15 0.15 0.45 0.45", "0 1 0.8 0.55 0.15 0.85 0.45", "0 1 0.6 0.15 0.55 0.45 0.85",
                     "0 1 0.4 0.55 0.55 0.85 0.85", "1 1 0.6 0.45 0.45 0.75 0.75", "1 1 0.0 0.25 0.25 0.55 0.55"])


def test_no_detection_gives_one_row_per_image(xp):
    check(detect(xp, confidence_threshold=2.0), ["0 -1 -1 -1 -1 -1 -1", "1 -1 -1 -1 -1 -1 -1"])


def test_variance_in_target_and_clip(xp):
    # offsets of +-0.5 and more taken as they are: boxes leave the image unless clipped (OpenCV's clip)
    unclipped = detect(xp, variance_encoded_in_target=True, confidence_threshold=0.5)
    assert unclipped[0, 0, :, 3:].min() < 0
    clipped = detect(xp, variance_encoded_in_target=True, confidence_threshold=0.5, clip=True)
    assert clipped[0, 0, :, 3:].min() >= 0 and clipped[0, 0, :, 3:].max() <= 1 and (clipped[0, 0, :, 3:] == 0).any()


def results_setup(tmp_path, output_format, **extra):
    """A label map (background, cat) and a name size file for the two images (100 x 200 and 50 x 80)."""
    (tmp_path / "labelmap.prototxt").write_text('item { name: "none_of_the_above" label: 0 display_name: "bg" }\n'
                                                'item { name: "cat" label: 1 display_name: "Cat" }\n')
    (tmp_path / "name_size.txt").write_text("000001 100 200\n000002 50 80\n")
    return {"save_output_param": dict({"output_directory": str(tmp_path / "results"), "output_format": output_format,
                                       "output_name_prefix": "comp4_det_test_",
                                       "label_map_file": str(tmp_path / "labelmap.prototxt"),
                                       "name_size_file": str(tmp_path / "name_size.txt")}, **extra)}


# test_share_location's detections in pixels of each image: x = xmin * width, y = ymin * height, truncated
VOC_LINES = ["000001 1 30 15 90 45", "000001 0.8 110 15 170 45", "000001 0.6 30 55 90 85", "000001 0.4 110 55 170 85",
             "000002 0.6 36 22 60 37", "000002 0 20 12 44 27"]


def test_voc_result_files_as_the_fork_writes_them(tmp_path, xp):
    detect(xp, **results_setup(tmp_path, "VOC"))
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["comp4_det_test_cat.txt"]
    assert (tmp_path / "results" / "comp4_det_test_cat.txt").read_text().splitlines() == VOC_LINES


def test_ilsvrc_and_coco_result_files(tmp_path):
    detect(numpy, **results_setup(tmp_path, "ILSVRC"))
    lines = (tmp_path / "results" / "comp4_det_test_.txt").read_text().splitlines()
    assert lines == [f"{line.split()[0]} 1 {' '.join(line.split()[1:])}" for line in VOC_LINES]
    detect(numpy, **results_setup(tmp_path, "COCO"))
    records = json.loads((tmp_path / "results" / "comp4_det_test_.json").read_text())
    assert len(records) == 6 and records[0] == {"image_id": 1, "category_id": "cat", "bbox": [30.0, 15.0, 60.0, 30.0],
                                                "score": 1.0}
    assert records[4]["image_id"] == 2 and records[4]["bbox"] == [36.0, 22.5, 24.0, 15.0]


def test_a_round_of_files_every_num_test_image_images(tmp_path):
    # num_test_image 1: each image is a round of its own, named and sized by the file's first line, as in the
    # fork; the second image's round replaces the first's files
    detect(numpy, **results_setup(tmp_path, "VOC", num_test_image=1))
    lines = (tmp_path / "results" / "comp4_det_test_cat.txt").read_text().splitlines()
    assert lines == ["000001 0.6 90 45 150 75", "000001 0 50 25 110 55"]


def test_the_resize_of_the_test_data_is_undone(tmp_path):
    # FIT_LARGE_SIZE_AND_PAD to 300 x 300: the 100 x 200 image sat between y = 75 and 225, the 50 x 80 one between
    # y = 56.25 and 243.75; a box's y maps back through that band
    detect(numpy, **results_setup(tmp_path, "COCO", resize_param={"resize_mode": "FIT_LARGE_SIZE_AND_PAD",
                                                                   "height": 300, "width": 300}))
    records = json.loads((tmp_path / "results" / "comp4_det_test_.json").read_text())
    x, y, w, h = records[0]["bbox"]
    assert (x, w) == (30.0, 60.0)
    assert y == 0.0 and h == pytest.approx((0.45 - 0.25) / 0.5 * 100, abs=0.01)  # 0.15 is above the band: clipped


@pytest.mark.parametrize("extra, message", [
    ({"output_format": "PASCAL"}, "output_format must be one of VOC, COCO, ILSVRC, got 'PASCAL'"),
])
def test_result_file_settings_are_checked(tmp_path, extra, message):
    keys = results_setup(tmp_path, "VOC")
    keys["save_output_param"].update(extra)
    with pytest.raises(ConfigError, match=re.escape(message)):
        detect(numpy, **keys)
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


@pytest.mark.parametrize("extra, message", [
    ({"label_map_file": ""}, "save_output_param.label_map_file is needed to write result files"),
    ({"name_size_file": "data/VOC0712/test_name_size.txt"}, "test_name_size.txt: cannot read the name size file"),
    ({"num_test_image": 4952}, "num_test_image 4952 must be between 1 and the 2 images of"),
])
def test_a_deploy_file_whose_result_files_cannot_be_written_still_detects(tmp_path, caplog, extra, message):
    # ssd_pascal.py's deploy.prototxt keeps its test net's save_output_param, with paths under Caffe's root
    keys = results_setup(tmp_path, "VOC")
    keys["save_output_param"].update(extra)
    with caplog.at_level(logging.WARNING, logger="layerforge"):
        top = detect(numpy, **keys)
    assert "no result files will be written to" in caplog.text and message in caplog.text
    assert top.shape == (1, 1, 6, 7) and not (tmp_path / "results").exists()


def test_visualize_without_save_file_warns_that_no_window_opens(caplog):
    with caplog.at_level(logging.WARNING, logger="layerforge"):
        detect(numpy, visualize=True)
    assert "visualize opens no window here; give save_file" in caplog.text


def test_bad_inputs():
    with pytest.raises(ConfigError, match="required: num_classes"):
        create_layer({"type": "DetectionOutput", "bottom": ["a", "b", "c"], "top": "d", "detection_output": {}})
    with pytest.raises(ConfigError, match="eta must be in"):
        create_layer({"type": "DetectionOutput", "bottom": ["a", "b", "c"], "top": "d",
                      "detection_output": {"num_classes": 2, "nms_param": {"eta": 1.5}}})
    layer = create_layer({"type": "DetectionOutput", "bottom": ["a", "b", "c"], "top": "d",
                          "detection_output": {"num_classes": 3}})
    with pytest.raises(ShapeError, match="confidence predictions"):
        layer.setup(bottoms(True, numpy), [Blob(())])
