"""Deploy nets of Caffe's forks run by layerforge and by independent references, on trained-looking weights.

- The SSD family (OpenCV's face detector, MobileNet-SSD, SSD300 from weiliu89's ssd_pascal.py, TextBoxes;
  files in fork_models/, see its README) against OpenCV 4's Caffe importer: every blob within 1e-4 of its
  largest magnitude, the 1x1xNx7 detection lists as sets of rows. VGG-sized nets run with their trunk's
  widths divided (the heads, whose sizes are the priors' and classes', kept) to keep the suite fast.
- OpenPose (non-commercial licence: a net written here with its features) against OpenCV, built on its 1x1
  placeholder input and then run at a real size, as OpenPose does.
- SegNet and ENet (non-commercial: nets written here with their layer kinds) against PyTorch: a small
  interpreter of Caffe nets in torch.nn.functional (max_unpool2d for Upsample, the BN formula by hand).
- Fast R-CNN: ROIPooling against OpenCV's; py-faster-rcnn's VGG16 test.prototxt with a Python proposal layer
  of the project's kind, loaded from the project's lib/ folder.

The real files of the non-commercial projects were checked the same way from their repositories
(docs/caffe-import.md lists them and the differences found).
"""
import math
import pathlib
import re
import sys
import textwrap

import numpy
import pytest
from google.protobuf import text_format

from layerforge.caffe import caffe_pb
from layerforge.net import Net
from tests.caffe.test_opencv_reference import compare_with_opencv, opencv_path  # noqa: F401 (fixture)

MODELS = pathlib.Path(__file__).resolve().parent / "fork_models"


# ------------------------------------------------------------------------------------------------
# weights and nets

def trained_looking(net, rng):
    """He-scaled gaussian weights and small biases; BatchNorm statistics of unit-scale activations, BN and Scale
    factors near 1, Normalize scales near SSD's 20, PReLU slopes near 0.25."""
    for layer in net.layers:
        blobs = layer.blobs
        if not blobs:
            continue
        if layer.type == "BatchNorm":
            channels = blobs[0].shape
            blobs[0].data[...] = rng.normal(0, 0.2, channels)
            blobs[1].data[...] = rng.uniform(0.5, 2.0, channels)
            blobs[2].data[...] = 1.0
        elif layer.type in ("Scale", "BN"):
            blobs[0].data[...] = rng.uniform(0.8, 1.2, blobs[0].shape)
            for bias in blobs[1:]:
                bias.data[...] = rng.normal(0, 0.1, bias.shape)
        elif layer.type == "Normalize":
            blobs[0].data[...] = rng.uniform(10, 20, blobs[0].shape)
        elif layer.type == "PReLU":
            blobs[0].data[...] = rng.uniform(0.1, 0.4, blobs[0].shape)
        else:
            weight = blobs[0]
            fan_in = weight.count // weight.shape[1 if layer.type == "Deconvolution" else 0]
            weight.data[...] = rng.standard_normal(weight.shape) * numpy.sqrt(2.0 / fan_in)
            for bias in blobs[1:]:
                bias.data[...] = rng.standard_normal(bias.shape) * 0.1


def narrowed(text, divide, keep=r"mbox", shape=None):
    """The prototxt with every Convolution / InnerProduct whose name does not match ``keep`` ``divide`` times
    narrower (a depthwise convolution's group with it), and the net input ``shape`` when given."""
    net = text_format.Parse(text, caffe_pb.NetParameter())
    for layer in net.layer:
        p = layer.convolution_param if layer.type in ("Convolution", "Deconvolution") else \
            layer.inner_product_param if layer.type == "InnerProduct" else None
        if p is None or re.search(keep, layer.name):
            continue
        if layer.type != "InnerProduct" and p.group == p.num_output > 1:
            p.group = max(p.group // divide, 1)
        p.num_output = max(p.num_output // divide, 1)
    if shape is not None:
        del net.input_shape[:]
        del net.input_dim[:]
        net.input_shape.add(dim=shape)
    return text_format.MessageToString(net)


# ------------------------------------------------------------------------------------------------
# the SSD family against OpenCV

def textboxes_priors(text):
    """TextBoxes' deploy file with its PriorBox layers in OpenCV's terms: its fork repeats every prior half a cell
    lower, which ssd's PriorBox cannot say."""
    net = text_format.Parse(text, caffe_pb.NetParameter())
    for layer in net.layer:
        if layer.type == "PriorBox":
            layer.prior_box_param.offset_w.extend([0.5, 0.5])
            layer.prior_box_param.offset_h.extend([0.5, 1.0])
    return text_format.MessageToString(net)


SSD_NETS = {  # file -> (width divisor, input shape or None, rewrite); all are 300x300 nets but TextBoxes (700x700)
    "opencv_face_detector.prototxt": (1, None, None),
    "mobilenet_ssd.prototxt": (2, None, None),
    "ssd300_vgg16.prototxt": (8, None, None),
    "textboxes.prototxt": (8, (1, 3, 300, 300), textboxes_priors),
}


@pytest.mark.parametrize("name", sorted(SSD_NETS))
def test_ssd_deploy_files_agree_with_opencv(opencv_path, tmp_path, name):  # noqa: F811
    divide, shape, rewrite = SSD_NETS[name]
    text = (MODELS / name).read_text()
    if divide > 1 or shape:
        text = narrowed(text, divide, shape=shape)
    if rewrite:
        text = rewrite(text)
    net = compare_with_opencv(text, opencv_path, tmp_path, init=trained_looking, tolerance=1e-4,
                              rows=("detection_out",))
    detections = net.blobs["detection_out"].data
    assert detections.shape[2] >= 2 and (detections[0, 0, :, 1] >= 1).all()  # real detections, background skipped


def test_textboxes_as_written_says_what_its_priors_need(tmp_path):
    from layerforge.errors import ConfigError
    path = tmp_path / "textboxes.prototxt"
    path.write_text(narrowed((MODELS / "textboxes.prototxt").read_text(), 8, shape=(1, 3, 300, 300)))
    with pytest.raises(ConfigError, match=r"layer 'detection_out' \(DetectionOutput\): key 'bottom\[0\]': location "
                                          r"predictions .* twice the priors' count: TextBoxes' fork repeats every "
                                          r"prior half a cell lower \(give its PriorBox layers OpenCV's offset_w"):
        Net(str(path), phase="test")


def test_face_detector_with_opencvs_clip_agrees_with_opencv(opencv_path, tmp_path):  # noqa: F811
    # OpenCV's current face detector asks for its own field `clip: 1` and a stricter NMS
    text = (MODELS / "opencv_face_detector.prototxt").read_text()
    text = text.replace("nms_threshold: 0.3", "nms_threshold: 0.45").replace("confidence_threshold: 0.01",
                                                                             "confidence_threshold: 0.05\n    clip: 1")
    assert "clip: 1" in text
    net = compare_with_opencv(narrowed(text, 2, keep="mbox|^(?!)"), opencv_path, tmp_path, init=trained_looking,
                              tolerance=1e-4, rows=("detection_out",))
    boxes = net.blobs["detection_out"].data[0, 0, :, 3:]
    assert boxes.min() >= 0 and boxes.max() <= 1


# ------------------------------------------------------------------------------------------------
# OpenPose: its placeholder shape, against OpenCV

def openpose_like(stages=2, width=8):
    """OpenPose COCO's structure, narrow: an input of 1x1 to be reshaped, VGG blocks with 2x2/2 poolings, then
    stages of two branches (PAFs and heatmaps) whose outputs are concatenated with the features."""
    lines = ['name: "openpose_like"', 'input: "image"', *[f"input_dim: {d}" for d in (1, 3, 1, 1)]]

    def conv(name, bottom, out, kernel, relu=True):
        lines.append(f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}" '
                     f'convolution_param {{ num_output: {out} pad: {kernel // 2} kernel_size: {kernel} }} }}')
        if relu:
            lines.append(f'layer {{ name: "relu_{name}" type: "ReLU" bottom: "{name}" top: "{name}" }}')
        return name

    x = "image"
    for block in range(1, 4):
        x = conv(f"conv{block}_1", x, width * block, 3)
        x = conv(f"conv{block}_2", x, width * block, 3)
        lines.append(f'layer {{ name: "pool{block}_stage1" type: "Pooling" bottom: "{x}" top: "pool{block}_stage1" '
                     f'pooling_param {{ pool: MAX kernel_size: 2 stride: 2 }} }}')
        x = f"pool{block}_stage1"
    features = conv("conv4_4_CPM", x, width * 2, 3)
    x = features
    for stage in range(1, stages + 1):
        kernel = 3 if stage == 1 else 7
        outs = []
        for branch, maps in ((1, 6), (2, 4)):
            y = conv(f"conv_stage{stage}_L{branch}_1", x, width, kernel)
            outs.append(conv(f"conv_stage{stage}_L{branch}_out", y, maps, 1, relu=False))
        if stage < stages:
            bottoms = " ".join(f'bottom: "{b}"' for b in outs + [features])
            lines.append(f'layer {{ name: "concat_stage{stage + 1}" type: "Concat" {bottoms} '
                         f'top: "concat_stage{stage + 1}" concat_param {{ axis: 1 }} }}')
            x = f"concat_stage{stage + 1}"
    lines.append(f'layer {{ name: "net_output" type: "Concat" bottom: "{outs[1]}" bottom: "{outs[0]}" '
                 f'top: "net_output" concat_param {{ axis: 1 }} }}')
    return "\n".join(lines) + "\n"


def test_openpose_like_net_builds_on_its_placeholder_and_agrees_with_opencv(opencv_path, tmp_path):  # noqa: F811
    text = openpose_like()
    (tmp_path / "placeholder.prototxt").write_text(text)
    placeholder = Net(str(tmp_path / "placeholder.prototxt"), phase="test")
    assert placeholder.blobs["pool3_stage1"].shape == (1, 24, 1, 1)  # Caffe's shape: 2x2 kernels on 1x1 maps
    image = numpy.random.default_rng(1).standard_normal((1, 3, 40, 48)).astype(numpy.float32)
    net = compare_with_opencv(text, opencv_path, tmp_path, init=trained_looking, tolerance=1e-4,
                              inputs={"image": image})
    assert net.blobs["net_output"].shape == (1, 10, 5, 6)

