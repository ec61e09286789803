"""VideoData (the SSD fork's) and DetectionOutput's visualize with save_file: a detector run over a video file,
as the fork's examples/ssd/ssd_pascal_video.py does, with `layerforge test`."""
import os
import subprocess
import sys

import cv2
import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import ConfigError, DataError, EndOfData
from layerforge.layers import create_layer
from layerforge.net import Net

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_video(path, frames=7, size=(48, 64)):
    """A video of ``frames`` frames (MJPG): frame i is a gradient whose brightness grows with i."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30, (size[1], size[0]), True)
    ramp = numpy.add.outer(numpy.arange(size[0]), numpy.arange(size[1])).astype(numpy.float64)
    for i in range(frames):
        picture = numpy.stack([ramp, ramp[::-1], numpy.full(size, 20.0 * i)], axis=2)
        writer.write(numpy.clip(picture + 10 * i, 0, 255).astype(numpy.uint8))
    writer.release()
    return str(path)


def decoded(path):
    """Every frame of the video as OpenCV decodes it (H, W, 3)."""
    capture, frames = cv2.VideoCapture(str(path)), []
    while True:
        ok, frame = capture.read()
        if not ok:
            return frames
        frames.append(frame)


def video_layer(path, xp=numpy, batch_size=2, skip_frames=0, transform=None):
    layer = create_layer({"name": "video", "type": "VideoData", "top": ["data", "label"],
                          "data": {"batch_size": batch_size},
                          "video_data": {"video_type": "VIDEO", "video_file": str(path), "skip_frames": skip_frames},
                          "transform": transform or {}}, phase="TEST", dtype=numpy.float64, xp=xp)
    top = [Blob(xp=xp), Blob(xp=xp)]
    layer.setup([], top)
    return layer, top


@pytest.mark.parametrize("frames, batches", [(7, [[1, 3], [5]]), (9, [[1, 3], [5, 7]]), (10, [[1, 3], [5, 7], [9]])])
def test_frames_in_order_resized_after_skipping_skip_frames_before_each(tmp_path, xp, frames, batches):
    path = write_video(tmp_path / "v.avi", frames)
    want = decoded(path)
    transform = {"mean_value": [104, 117, 123], "resize_param": {"resize_mode": "WARP", "height": 24, "width": 30}}
    layer, top = video_layer(path, xp, skip_frames=1, transform=transform)
    assert top[0].shape == (2, 3, 24, 30)
    for kept in batches:
        layer.forward([], top)
        assert top[0].shape == (len(kept), 3, 24, 30)
        for j, k in enumerate(kept):
            resized = cv2.resize(want[k], (30, 24), interpolation=cv2.INTER_LINEAR).astype(numpy.float64)
            numpy.testing.assert_array_equal(to_numpy(top[0].data)[j], (resized - [104, 117, 123]).transpose(2, 0, 1))
        numpy.testing.assert_array_equal(to_numpy(top[1].data), 0)
    with pytest.raises(EndOfData, match=rf"layer 'video' \(VideoData\): video '.*v.avi' ended after {frames} frames "
                                        rf"\({sum(map(len, batches))} kept\)"):
        layer.forward([], top)


def test_sources_that_cannot_be_read_are_one_line(tmp_path):
    with pytest.raises(DataError, match=r"layer 'video' \(VideoData\): cannot open video '.*missing.avi'"):
        video_layer(tmp_path / "missing.avi")
    with pytest.raises(ConfigError, match="video_type VIDEO needs video_file"):
        create_layer({"name": "v", "type": "VideoData", "top": "data", "data": {"batch_size": 1},
                      "video_data": {"video_type": "VIDEO"}})
    with pytest.raises(DataError, match=r"cannot open webcam 63"):
        create_layer({"name": "v", "type": "VideoData", "top": "data", "data": {"batch_size": 1},
                      "video_data": {"device_id": 63}}).setup([], [Blob()])


# a one-head SSD over the video: PriorBox on a 6x8 map, location and confidence convolutions, DetectionOutput
# drawing its detections on the frames restored at 60x80 into a video, with `layerforge test`
SSD = """name: "ssd_video"
layer {{ name: "data" type: "VideoData" top: "data"
        transform_param {{ mean_value: 104 mean_value: 117 mean_value: 123
          resize_param {{ prob: 1 resize_mode: WARP height: 48 width: 64 interp_mode: LINEAR }} }}
        data_param {{ batch_size: 2 }} video_data_param {{ video_type: VIDEO video_file: "{video}" }} }}
layer {{ name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param {{ num_output: 8 kernel_size: 8
        stride: 8 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loc" type: "Convolution" bottom: "conv" top: "loc" convolution_param {{ num_output: 4 kernel_size: 1
        weight_filler {{ type: "gaussian" std: 0.01 }} }} }}
layer {{ name: "loc_perm" type: "Permute" bottom: "loc" top: "loc_perm" permute_param {{ order: 0 order: 2 order: 3
        order: 1 }} }}
layer {{ name: "loc_flat" type: "Flatten" bottom: "loc_perm" top: "loc_flat" }}
layer {{ name: "conf" type: "Convolution" bottom: "conv" top: "conf" convolution_param {{ num_output: 3 kernel_size: 1
        weight_filler {{ type: "gaussian" std: 0.002 }} }} }}
layer {{ name: "conf_perm" type: "Permute" bottom: "conf" top: "conf_perm" permute_param {{ order: 0 order: 2
        order: 3 order: 1 }} }}
layer {{ name: "conf_flat" type: "Flatten" bottom: "conf_perm" top: "conf_flat" }}
layer {{ name: "conf_reshape" type: "Reshape" bottom: "conf_flat" top: "conf_reshape" reshape_param {{ shape {{
        dim: 0 dim: -1 dim: 3 }} }} }}
layer {{ name: "conf_softmax" type: "Softmax" bottom: "conf_reshape" top: "conf_softmax" softmax_param {{ axis: 2 }} }}
layer {{ name: "conf_out" type: "Flatten" bottom: "conf_softmax" top: "conf_out" }}
layer {{ name: "priors" type: "PriorBox" bottom: "conv" bottom: "data" top: "priors" prior_box_param {{
        min_size: 24 variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 }} }}
layer {{ name: "detection_out" type: "DetectionOutput" bottom: "loc_flat" bottom: "conf_out" bottom: "priors"
        bottom: "data" top: "detection_out"
        transform_param {{ mean_value: 104 mean_value: 117 mean_value: 123
          resize_param {{ prob: 1 resize_mode: WARP height: 60 width: 80 interp_mode: LINEAR }} }}
        detection_output_param {{ num_classes: 3 background_label_id: 0 code_type: CENTER_SIZE keep_top_k: 5
          nms_param {{ nms_threshold: 0.45 top_k: 20 }} confidence_threshold: 0.01
          save_output_param {{ label_map_file: "{labels}" }}
          visualize: true visualize_threshold: 0.0 save_file: "{out}" }} }}
"""


def run_test_command(tmp_path, video, threshold):
    """``layerforge test`` of the SSD over ``video`` drawing detections scoring ``threshold``; returns the
    process and the drawn video's frames."""
    out = tmp_path / f"out_{threshold}.avi"
    net_path = tmp_path / f"ssd_{threshold}.prototxt"
    net_path.write_text(SSD.format(video=video, labels=tmp_path / "labels.prototxt", out=out).replace(
        "visualize_threshold: 0.0", f"visualize_threshold: {threshold}"))
    if not (tmp_path / "w.npz").exists():
        net = Net(str(net_path), phase="test")
        net.save(str(tmp_path / "w.npz"))
        net.layers[0].close()
    done = subprocess.run([sys.executable, "-m", "layerforge", "test", "--model", str(net_path), "--weights",
                           str(tmp_path / "w.npz"), "--iterations", "100"], capture_output=True, text=True, cwd=REPO)
    return done, decoded(out)


def test_a_detector_over_a_video_with_layerforge_test(tmp_path):
    video = write_video(tmp_path / "in.avi", frames=5)
    (tmp_path / "labels.prototxt").write_text('item { name: "background" label: 0 }\n'
                                              'item { name: "ring" label: 1 display_name: "Ring" }\n'
                                              'item { name: "bar" label: 2 display_name: "Bar" }\n')
    done, drawn = run_test_command(tmp_path, video, 0.0)
    assert done.returncode == 0, done.stderr
    assert "ended after 5 frames (5 kept): stopping after 3 batches" in done.stderr
    assert "detection_out changes shape between batches ((1, 1, 10, 7), then (1, 1, 5, 7)): not averaged" in \
        done.stderr
    assert len(drawn) == 5 and drawn[0].shape == (60, 80, 3)
    _, undrawn = run_test_command(tmp_path, video, 1.5)  # no detection scores 1.5: the frames alone
    plain = cv2.resize(cv2.resize(decoded(video)[0], (64, 48)), (80, 60)).astype(numpy.float64)
    assert (numpy.abs(undrawn[0] - plain).max(axis=2)[:20] > 60).mean() > 0.5  # the frames-per-second box
    boxes = numpy.abs(drawn[0].astype(numpy.float64) - undrawn[0]).max(axis=2) > 60
    assert boxes[25:].mean() > 0.05, boxes.mean()  # box outlines and captions below that box
