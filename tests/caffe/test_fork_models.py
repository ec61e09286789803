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
from tests.caffe.test_opencv_reference import compare_with_opencv, opencv  # noqa: F401 (fixture)

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
    "opencv_face_detector.prototxt": (4, None, None),
    "mobilenet_ssd.prototxt": (4, None, None),
    "ssd300_vgg16.prototxt": (16, None, None),
    "textboxes.prototxt": (16, (1, 3, 300, 300), textboxes_priors),
}


@pytest.mark.parametrize("name", sorted(SSD_NETS))
def test_ssd_deploy_files_load_at_full_width(tmp_path, name):
    rewrite = SSD_NETS[name][2]
    path = tmp_path / name
    text = (MODELS / name).read_text()
    path.write_text(rewrite(text) if rewrite else text)
    net = Net(str(path), phase="test")
    priors = net.blobs["mbox_priorbox"].shape[2] // 4
    assert net.blobs["mbox_loc"].shape == (1, priors * 4) and net.blobs["detection_out"].shape == (1, 1, 1, 7)
    # SSD300's and MobileNet-SSD's published prior counts; the face detector's maps end at 5x5 twice; TextBoxes at
    # 700x700: 12 priors per cell on conv4_3's 88x88 map, 14 on the 44, 22, 11, 6 and 1-wide maps after it
    assert priors == {"opencv_face_detector.prototxt": 4 * 38 * 38 + 6 * (19 * 19 + 10 * 10 + 5 * 5) + 4 * 2 * 5 * 5,
                      "mobilenet_ssd.prototxt": 1917,
                      "ssd300_vgg16.prototxt": 8732,
                      "textboxes.prototxt": 12 * 88 * 88 + 14 * (44 * 44 + 22 * 22 + 11 * 11 + 6 * 6 + 1)}[name]


@pytest.mark.parametrize("name", sorted(SSD_NETS))
def test_ssd_deploy_files_agree_with_opencv(opencv, tmp_path, name):  # noqa: F811
    divide, shape, rewrite = SSD_NETS[name]
    text = (MODELS / name).read_text()
    if divide > 1 or shape:
        text = narrowed(text, divide, shape=shape)
    if rewrite:
        text = rewrite(text)
    net = compare_with_opencv(text, opencv, tmp_path, init=trained_looking, tolerance=1e-4,
                              rows=("detection_out",))
    detections = net.blobs["detection_out"].data
    assert detections.shape[2] >= 2 and (detections[0, 0, :, 1] >= 1).all()  # real detections, background skipped


def test_textboxes_as_written_says_what_its_priors_need(tmp_path):
    from layerforge.errors import ConfigError
    path = tmp_path / "textboxes.prototxt"
    path.write_text(narrowed((MODELS / "textboxes.prototxt").read_text(), 8, shape=(1, 3, 300, 300)))
    with pytest.raises(ConfigError, match=r"layer 'detection_out' \(DetectionOutput\): key 'bottom\[0\]': location "
                                          r"predictions .* twice the priors' count: TextBoxes' fork repeats every "
                                          r"prior half a cell lower \(convert its file with `layerforge convert "
                                          r"--fork textboxes`, or give its PriorBox layers OpenCV's offset_w"):
        Net(str(path), phase="test")


def textboxes_fork_priors(min_size, max_size, aspect_ratios, clip, map_hw, image_hw):
    """MhLiao/TextBoxes' PriorBoxLayer::Forward_cpu written out: per cell, the min_size square, the
    sqrt(min * max) square, then each aspect ratio but 1 (flip false in its files), each at the cell's centre and
    then half a cell lower; (N, 4) corners over the image size."""
    (h_map, w_map), (h_img, w_img) = map_hw, image_hw
    step_x, step_y = w_img / w_map, h_img / h_map
    sizes = [(min_size, min_size)] + ([(math.sqrt(min_size * max_size),) * 2] if max_size else []) + \
        [(min_size * math.sqrt(r), min_size / math.sqrt(r)) for r in aspect_ratios if abs(r - 1) > 1e-6]
    rows = []
    for h in range(h_map):
        for w in range(w_map):
            cx = (w + 0.5) * step_x
            for bw, bh in sizes:
                for cy in ((h + 0.5) * step_y, (h + 1.0) * step_y):
                    rows.append([(cx - bw / 2) / w_img, (cy - bh / 2) / h_img, (cx + bw / 2) / w_img,
                                 (cy + bh / 2) / h_img])
    rows = numpy.array(rows)
    return numpy.clip(rows, 0, 1) if clip else rows


@pytest.mark.parametrize("shape", [(1, 3, 300, 300), (2, 3, 156, 204)])
def test_textboxes_converted_for_its_fork_loads_and_gives_the_forks_priors(tmp_path, shape):
    from layerforge.cli import main
    source, out = tmp_path / "textboxes.prototxt", tmp_path / "textboxes.yaml"
    source.write_text(narrowed((MODELS / "textboxes.prototxt").read_text(), 8, shape=shape))
    assert main(["convert", str(source), "--fork", "textboxes", "-o", str(out)]) == 0
    assert "--fork textboxes: 6 PriorBox layers repeat every prior half a cell lower" in out.read_text()
    net = Net(str(out), phase="test")
    rng = numpy.random.default_rng(0)
    net.blobs["data"].data[...] = rng.uniform(0, 255, shape)
    net.forward()
    checked = 0
    for layer in net.layers:
        if layer.type != "PriorBox":
            continue
        p = layer.layer_param.prior_box
        fmap = net.blobs[layer.layer_param.bottom[0]].shape[2:]
        want = textboxes_fork_priors(p.min_size[0], p.max_size[0] if p.max_size else 0, p.aspect_ratio, p.clip,
                                     fmap, shape[2:])
        got = numpy.asarray(net.blobs[layer.layer_param.top[0]].data)
        numpy.testing.assert_allclose(got[0, 0].reshape(-1, 4), want, rtol=0, atol=1e-6, err_msg=layer.name)
        numpy.testing.assert_allclose(got[0, 1].reshape(-1, 4), numpy.tile([0.1, 0.1, 0.2, 0.2], (len(want), 1)),
                                      rtol=1e-6)
        checked += 1
    assert checked == 6
    assert net.blobs["detection_out"].shape[:2] == (1, 1) and net.blobs["detection_out"].shape[3] == 7


def test_fork_textboxes_refuses_what_it_cannot_say(tmp_path, capsys):
    from layerforge.cli import main
    plain = tmp_path / "plain.prototxt"
    plain.write_text(textwrap.dedent("""\
        name: "p"
        input: "data"
        input_shape { dim: 1 dim: 3 dim: 8 dim: 8 }
        layer { name: "r" type: "ReLU" bottom: "data" top: "r" }
        """))
    assert main(["convert", str(plain), "--fork", "textboxes"]) == 2
    assert "--fork textboxes: the net has no PriorBox layer" in capsys.readouterr().err
    stepped = tmp_path / "stepped.prototxt"
    stepped.write_text((MODELS / "textboxes.prototxt").read_text().replace("min_size: 30.0", "min_size: 30.0 step: 8",
                                                                             1))
    assert main(["convert", str(stepped), "--fork", "textboxes"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "layer 'conv4_3_norm_mbox_priorbox' (PriorBox): key 'prior_box.step'" in err[0]


def test_face_detector_with_opencvs_clip_agrees_with_opencv(opencv, tmp_path):  # noqa: F811
    # OpenCV's current face detector asks for its own field `clip: 1` and a stricter NMS
    text = (MODELS / "opencv_face_detector.prototxt").read_text()
    text = text.replace("nms_threshold: 0.3", "nms_threshold: 0.45").replace("confidence_threshold: 0.01",
                                                                             "confidence_threshold: 0.05\n    clip: 1")
    assert "clip: 1" in text
    net = compare_with_opencv(narrowed(text, 4), opencv, tmp_path, init=trained_looking,
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


def test_openpose_like_net_builds_on_its_placeholder_and_agrees_with_opencv(opencv, tmp_path):  # noqa: F811
    text = openpose_like()
    (tmp_path / "placeholder.prototxt").write_text(text)
    placeholder = Net(str(tmp_path / "placeholder.prototxt"), phase="test")
    assert placeholder.blobs["pool3_stage1"].shape == (1, 24, 1, 1)  # Caffe's shape: 2x2 kernels on 1x1 maps
    image = numpy.random.default_rng(1).standard_normal((1, 3, 40, 48)).astype(numpy.float32)
    net = compare_with_opencv(text, opencv, tmp_path, init=trained_looking, tolerance=1e-4,
                              inputs={"image": image})
    assert net.blobs["net_output"].shape == (1, 10, 5, 6)



# ------------------------------------------------------------------------------------------------
# SegNet and ENet against PyTorch

def segnet_like(width=4, bn_mode="INFERENCE"):
    """SegNet's encoder-decoder, narrow: conv-BN-ReLU blocks, MAX poolings with their mask tops, Upsample layers
    unpooling through those masks (scale, and upsample_h / upsample_w for an odd size), a Softmax."""
    lines = ['name: "segnet_like"', 'input: "data"', *[f"input_dim: {d}" for d in (2, 3, 20, 26)]]

    def cbr(name, bottom, out):
        lines.append(f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}" '
                     f'convolution_param {{ num_output: {out} kernel_size: 3 pad: 1 }} }}')
        lines.append(f'layer {{ name: "{name}_bn" type: "BN" bottom: "{name}" top: "{name}" bn_param {{ '
                     f'bn_mode: {bn_mode} scale_filler {{ type: "constant" value: 1 }} '
                     f'shift_filler {{ type: "constant" value: 0.001 }} }} }}')
        lines.append(f'layer {{ name: "{name}_relu" type: "ReLU" bottom: "{name}" top: "{name}" }}')
        return name

    x, sizes = "data", []
    for level in range(1, 4):
        x = cbr(f"conv{level}", x, width * level)
        lines.append(f'layer {{ name: "pool{level}" type: "Pooling" bottom: "{x}" top: "pool{level}" '
                     f'top: "pool{level}_mask" pooling_param {{ pool: MAX kernel_size: 2 stride: 2 }} }}')
        x = f"pool{level}"
    # 20x26 pools (ceil) to 10x13, 5x7, 3x4: the odd sizes come back through upsample_h / upsample_w
    shapes = {3: "upsample_h: 5 upsample_w: 7", 2: "upsample_h: 10 upsample_w: 13", 1: "scale: 2"}
    for level in range(3, 0, -1):
        lines.append(f'layer {{ name: "up{level}" type: "Upsample" bottom: "{x}" bottom: "pool{level}_mask" '
                     f'top: "up{level}" upsample_param {{ {shapes[level]} }} }}')
        x = cbr(f"conv{level}_D", f"up{level}", width * max(level - 1, 1))
    lines.append(f'layer {{ name: "prob" type: "Softmax" bottom: "{x}" top: "prob" }}')
    return "\n".join(lines) + "\n"


def enet_like(width=4):
    """ENet's blocks, narrow: an initial block (conv and pooling concatenated), BN in INFERENCE mode with PReLU,
    asymmetric (5x1, 1x5) and dilated convolutions, a bottleneck with a pooling mask, the decoder's
    Upsample through that mask added to a main branch, a Deconvolution."""
    lines = ['name: "enet_like"', 'layer { name: "data" type: "Input" top: "data" '
             'input_param { shape { dim: 1 dim: 3 dim: 24 dim: 32 } } }']

    def conv(name, bottom, out, extra="kernel_size: 3 pad: 1", kind="Convolution", bn=True):
        lines.append(f'layer {{ name: "{name}" type: "{kind}" bottom: "{bottom}" top: "{name}" '
                     f'convolution_param {{ num_output: {out} {extra} }} }}')
        if not bn:
            return name
        lines.append(f'layer {{ name: "bn_{name}" type: "BN" bottom: "{name}" top: "bn_{name}" '
                     f'bn_param {{ bn_mode: INFERENCE scale_filler {{ type: "constant" value: 1 }} }} }}')
        lines.append(f'layer {{ name: "prelu_{name}" type: "PReLU" bottom: "bn_{name}" top: "prelu_{name}" }}')
        return f"prelu_{name}"

    c = conv("conv0", "data", width - 3, "kernel_size: 3 pad: 1 stride: 2", bn=False)
    lines.append('layer { name: "pool0" type: "Pooling" bottom: "data" top: "pool0" '
                 'pooling_param { pool: MAX kernel_size: 2 stride: 2 } }')
    lines.append(f'layer {{ name: "concat0" type: "Concat" bottom: "{c}" bottom: "pool0" top: "concat0" }}')
    x = conv("bn0", "concat0", width, "kernel_size: 1", bn=True)
    lines.append(f'layer {{ name: "pool1" type: "Pooling" bottom: "{x}" top: "pool1" top: "pool1_mask" '
                 f'pooling_param {{ pool: MAX kernel_size: 2 stride: 2 }} }}')
    y = conv("asym_a", "pool1", width, "kernel_h: 5 kernel_w: 1 pad_h: 2 pad_w: 0")
    y = conv("asym_b", y, width, "kernel_h: 1 kernel_w: 5 pad_h: 0 pad_w: 2")
    y = conv("dilated", y, width, "kernel_size: 3 pad: 2 dilation: 2")
    lines.append(f'layer {{ name: "sum1" type: "Eltwise" bottom: "{y}" bottom: "pool1" top: "sum1" }}')
    lines.append('layer { name: "up1" type: "Upsample" bottom: "sum1" bottom: "pool1_mask" top: "up1" '
                 'upsample_param { scale: 2 } }')
    z = conv("deconv1", x, width, "kernel_size: 2 stride: 2 bias_term: false", kind="Deconvolution")
    lines.append(f'layer {{ name: "pooled_back" type: "Pooling" bottom: "{z}" top: "pooled_back" '
                 f'pooling_param {{ pool: AVE kernel_size: 2 stride: 2 }} }}')
    lines.append('layer { name: "sum2" type: "Eltwise" bottom: "up1" bottom: "pooled_back" top: "sum2" }')
    conv("fullconv", "sum2", 5, "kernel_size: 2 stride: 2", kind="Deconvolution", bn=False)
    return "\n".join(lines) + "\n"


def compare_with_torch(text, tmp_path, tolerance=1e-4):
    """Run ``text`` in layerforge (float64) and in the torch reference on the same weights and input."""
    pytest.importorskip("torch")
    from tests.caffe import torch_caffe
    path = tmp_path / "net.prototxt"
    path.write_text(text)
    net = Net(str(path), phase="test", dtype="float64")
    rng = numpy.random.default_rng(3)
    trained_looking(net, rng)
    inputs = {name: rng.standard_normal(net.blobs[name].shape) for name in net.inputs}
    net.forward(**inputs)
    reference = torch_caffe.run(net, inputs)
    compared = 0
    for name, value in reference.items():
        ours = net.blobs[name].data
        scale = float(numpy.abs(value).max(initial=0.0)) or 1.0
        numpy.testing.assert_allclose(ours, value.reshape(ours.shape), rtol=0, atol=tolerance * scale,
                                      err_msg=f"blob '{name}'")
        compared += 1
    assert compared == len(net.blobs)
    return net


@pytest.mark.parametrize("bn_mode", ["INFERENCE", "LEARN"])
def test_segnet_like_net_agrees_with_torch(tmp_path, bn_mode):
    net = compare_with_torch(segnet_like(bn_mode=bn_mode), tmp_path)
    assert net.blobs["up3"].shape == (2, 12, 5, 7) and net.blobs["prob"].shape == (2, 4, 20, 26)
    assert (net.blobs["up1"].data == 0).mean() > 0.7  # three quarters of an unpooled map are zeros


BAYESIAN = """name: "bayesian_like"
input: "data"
input_dim: 256
input_dim: 3
input_dim: 6
input_dim: 6
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 4 kernel_size: 3
        pad: 1 } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" top: "pool1_mask" pooling_param { pool: MAX
        kernel_size: 2 stride: 2 } }
layer { name: "encdrop1" type: "Dropout" bottom: "pool1" top: "pool1" dropout_param { dropout_ratio: 0.5
        sample_weights_test: true } }
layer { name: "upsample1" type: "Upsample" bottom: "pool1" bottom: "pool1_mask" top: "up1" upsample_param { scale: 2 } }
layer { name: "conv1_D" type: "Convolution" bottom: "up1" top: "conv1_D" convolution_param { num_output: 3
        kernel_size: 3 pad: 1 } }
"""


def test_bayesian_segnet_dropout_samples_at_test_time(tmp_path):
    """Bayesian SegNet's Monte Carlo dropout (``sample_weights_test``): its test script feeds one image repeated
    along the batch and takes the mean and variance of the samples. Each sample draws its own mask, and since
    everything after the dropout here is linear, the samples' mean is the net without dropout's output."""
    (tmp_path / "b.prototxt").write_text(BAYESIAN)
    (tmp_path / "d.prototxt").write_text(BAYESIAN.replace("sample_weights_test: true", ""))
    mc = Net(str(tmp_path / "b.prototxt"), phase="test", dtype="float64")
    plain = Net(str(tmp_path / "d.prototxt"), phase="test", dtype="float64")
    rng = numpy.random.default_rng(4)
    trained_looking(mc, rng)
    plain.copy_from(mc.state_arrays())
    image = numpy.repeat(rng.standard_normal((1, 3, 6, 6)), 256, axis=0)
    samples = mc.forward(data=image)["conv1_D"].copy()
    want = plain.forward(data=image)["conv1_D"][0]
    assert numpy.ptp(samples, axis=0).min() > 0  # every output varies across the samples
    spread = samples.std(axis=0) / numpy.sqrt(len(samples))  # the standard error of the mean, per output
    assert (numpy.abs(samples.mean(axis=0) - want) <= 5 * spread + 1e-12).all()
    again = mc.forward(data=image)["conv1_D"]
    assert (again != samples).any()  # a new draw on every forward


def test_enet_like_net_agrees_with_torch(tmp_path):
    net = compare_with_torch(enet_like(), tmp_path)
    assert net.blobs["fullconv"].shape == (1, 5, 24, 32)


# ------------------------------------------------------------------------------------------------
# Fast R-CNN: ROIPooling against OpenCV; py-faster-rcnn's test.prototxt with a proposal layer of its kind

ROI_NET = """name: "roi"
input: "data"
input_shape { dim: 2 dim: 3 dim: 24 dim: 32 }
input: "rois"
input_shape { dim: 5 dim: 5 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 6 kernel_size: 3
        pad: 1 stride: 2 } }
layer { name: "roi_pool" type: "ROIPooling" bottom: "conv" bottom: "rois" top: "roi_pool"
        roi_pooling_param { pooled_h: 3 pooled_w: 4 spatial_scale: 0.25 } }
layer { name: "fc" type: "InnerProduct" bottom: "roi_pool" top: "fc" inner_product_param { num_output: 7 } }
"""


@pytest.mark.parametrize("rois", [
    [[0, 1, 1, 29, 21], [1, 5, 9, 13, 13], [1, 21, 1, 31, 9], [0, 9, 3, 9, 3], [1, 1, 5, 31, 23]],  # k.25, k.75
    [[0, 2, 2, 30, 22], [1, 6, 10, 14, 14], [1, 22, 2, 30, 10], [0, 10, 6, 10, 6], [1, 2, 6, 30, 22]],  # k.5
])
def test_roi_pooling_agrees_with_opencv(opencv, tmp_path, rois):  # noqa: F811
    rois = numpy.array(rois, dtype=numpy.float32)
    data = numpy.random.default_rng(4).standard_normal((2, 3, 24, 32)).astype(numpy.float32)
    net = compare_with_opencv(ROI_NET, opencv, tmp_path, init=trained_looking, tolerance=1e-4,
                              inputs={"data": data, "rois": rois})
    assert net.blobs["roi_pool"].shape == (5, 6, 3, 4)


PROPOSAL_LAYER = '''
import caffe
import numpy as np
import yaml
from fast_rcnn.config import cfg
from layerforge.kernels.bbox import non_maximum_suppression


def anchors(base=16, ratios=(0.5, 1, 2), scales=(8, 16, 32)):
    """py-faster-rcnn's 9 anchors around the (base - 1) / 2 centre, [x1, y1, x2, y2]."""
    out, centre = [], (base - 1) / 2
    for r in ratios:
        w = np.round(np.sqrt(base * base / r))
        h = np.round(w * r)
        for s in scales:
            out.append([centre - (w * s - 1) / 2, centre - (h * s - 1) / 2, centre + (w * s - 1) / 2,
                        centre + (h * s - 1) / 2])
    return np.array(out)


class ProposalLayer(caffe.Layer):
    def setup(self, bottom, top):
        self._feat_stride = yaml.safe_load(self.param_str_)['feat_stride']
        self._anchors = anchors()
        top[0].reshape(1, 5)

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        settings = cfg[str(self.phase)]
        a = len(self._anchors)
        scores = bottom[0].data[:, a:, :, :].transpose(0, 2, 3, 1).reshape(-1)
        deltas = bottom[1].data.transpose(0, 2, 3, 1).reshape(-1, 4)
        height, width, scale = bottom[2].data[0]
        h, w = bottom[0].data.shape[2:]
        sx, sy = np.meshgrid(np.arange(w) * self._feat_stride, np.arange(h) * self._feat_stride)
        shifts = np.stack([sx.ravel(), sy.ravel(), sx.ravel(), sy.ravel()], axis=1)
        boxes = (self._anchors[None] + shifts[:, None]).reshape(-1, 4)
        widths, heights = boxes[:, 2] - boxes[:, 0] + 1, boxes[:, 3] - boxes[:, 1] + 1
        cx, cy = boxes[:, 0] + 0.5 * widths + deltas[:, 0] * widths, boxes[:, 1] + 0.5 * heights + deltas[:, 1] * heights
        pw, ph = np.exp(deltas[:, 2]) * widths, np.exp(deltas[:, 3]) * heights
        boxes = np.stack([cx - 0.5 * pw, cy - 0.5 * ph, cx + 0.5 * pw, cy + 0.5 * ph], axis=1)
        boxes = np.clip(boxes, 0, [width - 1, height - 1, width - 1, height - 1])
        keep = non_maximum_suppression(boxes / max(width, height), scores, settings['NMS_THRESH'],
                                       top_k=settings['PRE_NMS_TOP_N'])[:settings['POST_NMS_TOP_N']]
        rois = np.hstack([np.zeros((len(keep), 1)), boxes[keep]]).astype(np.float32)
        top[0].reshape(*rois.shape)
        top[0].data[...] = rois

    def backward(self, top, propagate_down, bottom):
        pass
'''


def test_faster_rcnn_test_prototxt_runs_with_the_projects_proposal_layer(tmp_path, monkeypatch):
    import os

    import layerforge.pycaffe
    lib = tmp_path / "lib"
    for name, text in {"rpn/__init__.py": "", "rpn/proposal_layer.py": PROPOSAL_LAYER, "fast_rcnn/__init__.py": "",
                       "fast_rcnn/config.py": "cfg = {'TEST': {'PRE_NMS_TOP_N': 600, 'POST_NMS_TOP_N': 30, "
                                              "'NMS_THRESH': 0.7}}\n"}.items():
        (lib / name).parent.mkdir(parents=True, exist_ok=True)
        (lib / name).write_text(text)
    # what py-faster-rcnn's tools/_init_paths.py does, with layerforge's pycaffe as `caffe`
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(layerforge.pycaffe.__file__), "python"))
    monkeypatch.syspath_prepend(str(lib))
    path = tmp_path / "test.prototxt"
    path.write_text(narrowed((MODELS / "faster_rcnn_vgg16_test.prototxt").read_text(), 16,
                             keep=r"^(rpn|cls_score|bbox_pred)"))
    try:
        net = Net(str(path), phase="test")
        trained_looking(net, numpy.random.default_rng(5))
        image = numpy.random.default_rng(6).standard_normal((1, 3, 96, 128)).astype(numpy.float32)
        out = net.forward(data=image, im_info=numpy.array([[96, 128, 1]], dtype=numpy.float32))
    finally:
        for name in ("rpn.proposal_layer", "rpn", "fast_rcnn.config", "fast_rcnn", "caffe"):
            sys.modules.pop(name, None)
    rois = net.blobs["rois"].data
    assert rois.shape == (30, 5) and (rois[:, 3] <= 127).all() and (rois[:, 4] <= 95).all()
    assert net.blobs["pool5"].shape == (30, 32, 7, 7)
    assert out["cls_prob"].shape == (30, 21) and out["bbox_pred"].shape == (30, 84)
    numpy.testing.assert_allclose(out["cls_prob"].sum(axis=1), 1.0, rtol=1e-5)


FAST_RCNN_TRAIN = """name: "fast_rcnn_like"
layer { name: "input" type: "Input" top: "data" top: "rois" top: "labels" top: "bbox_targets"
        top: "bbox_inside_weights" top: "bbox_outside_weights" top: "rpn_bbox_targets" top: "rpn_inside_weights"
        top: "rpn_outside_weights"
        input_param { shape { dim: 2 dim: 3 dim: 24 dim: 32 } shape { dim: 6 dim: 5 } shape { dim: 6 }
                      shape { dim: 6 dim: 12 } shape { dim: 6 dim: 12 } shape { dim: 6 dim: 12 }
                      shape { dim: 2 dim: 8 dim: 12 dim: 16 } shape { dim: 2 dim: 8 dim: 12 dim: 16 }
                      shape { dim: 2 dim: 8 dim: 12 dim: 16 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 8
        kernel_size: 3 pad: 1 stride: 2 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "rpn_bbox_pred" type: "Convolution" bottom: "conv1" top: "rpn_bbox_pred" convolution_param {
        num_output: 8 kernel_size: 1 weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "rpn_loss_bbox" type: "SmoothL1Loss" bottom: "rpn_bbox_pred" bottom: "rpn_bbox_targets"
        bottom: "rpn_inside_weights" bottom: "rpn_outside_weights" top: "rpn_loss_bbox" loss_weight: 1
        smooth_l1_loss_param { sigma: 3.0 } }
layer { name: "roi_pool" type: "ROIPooling" bottom: "conv1" bottom: "rois" top: "pool5"
        roi_pooling_param { pooled_h: 3 pooled_w: 3 spatial_scale: 0.5 } }
layer { name: "fc6" type: "InnerProduct" bottom: "pool5" top: "fc6" inner_product_param { num_output: 32
        weight_filler { type: "xavier" } } }
layer { name: "relu6" type: "ReLU" bottom: "fc6" top: "fc6" }
layer { name: "cls_score" type: "InnerProduct" bottom: "fc6" top: "cls_score" inner_product_param { num_output: 3
        weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "bbox_pred" type: "InnerProduct" bottom: "fc6" top: "bbox_pred" inner_product_param { num_output: 12
        weight_filler { type: "gaussian" std: 0.001 } } }
layer { name: "loss_cls" type: "SoftmaxWithLoss" bottom: "cls_score" bottom: "labels" top: "loss_cls"
        loss_weight: 1 }
layer { name: "loss_bbox" type: "SmoothL1Loss" bottom: "bbox_pred" bottom: "bbox_targets"
        bottom: "bbox_inside_weights" bottom: "bbox_outside_weights" top: "loss_bbox" loss_weight: 1 }
"""


def test_fast_rcnn_training_net_with_its_smooth_l1_losses_learns(tmp_path):
    """py-faster-rcnn's training heads (ROIPooling, SoftmaxWithLoss, SmoothL1Loss with inside and outside weights,
    the RPN's with sigma 3) on fixed rois, through pycaffe's SGDSolver as its train.py drives them: both losses
    fall, and a background roi's box regression (weights 0) has no say."""
    import layerforge.pycaffe as caffe

    (tmp_path / "train.prototxt").write_text(FAST_RCNN_TRAIN)
    (tmp_path / "solver.prototxt").write_text(f'train_net: "{tmp_path / "train.prototxt"}"\nbase_lr: 0.02\n'
                                              'momentum: 0.9\nlr_policy: "fixed"\ndisplay: 0\nrandom_seed: 3\n')
    caffe.set_mode_cpu()
    solver = caffe.SGDSolver(str(tmp_path / "solver.prototxt"))
    g = numpy.random.default_rng(7)
    blobs = solver.net.blobs
    blobs["data"].data[...] = g.standard_normal((2, 3, 24, 32))
    blobs["rois"].data[...] = [[0, 0, 0, 15, 11], [0, 8, 4, 31, 23], [1, 2, 2, 20, 18], [1, 10, 0, 31, 15],
                               [0, 4, 6, 12, 20], [1, 0, 8, 16, 23]]
    labels = numpy.array([1, 2, 0, 1, 2, 0])
    blobs["labels"].data[...] = labels
    targets, weights = numpy.zeros((6, 12)), numpy.zeros((6, 12))
    for i, label in enumerate(labels):
        if label:  # py-faster-rcnn's _get_bbox_regression_labels: the label's 4 columns
            targets[i, 4 * label:4 * label + 4] = g.normal(0, 0.5, 4)
            weights[i, 4 * label:4 * label + 4] = 1.0
    blobs["bbox_targets"].data[...] = targets
    blobs["bbox_inside_weights"].data[...] = weights
    blobs["bbox_outside_weights"].data[...] = weights
    blobs["rpn_bbox_targets"].data[...] = g.uniform(-0.5, 0.5, (1, 8, 1, 1))  # a shift per anchor coordinate
    inside = g.random((2, 8, 12, 16)) < 0.3  # the anchors matched to a box
    blobs["rpn_inside_weights"].data[...] = inside
    blobs["rpn_outside_weights"].data[...] = inside / inside.sum() * 8  # anchor_target_layer's 1 / examples
    solver.step(1)
    first = {k: float(blobs[k].data) for k in ("loss_cls", "loss_bbox", "rpn_loss_bbox")}
    solver.step(60)
    last = {k: float(blobs[k].data) for k in first}
    assert last["loss_cls"] < 0.2 * first["loss_cls"], (first, last)
    assert last["loss_bbox"] < 0.2 * first["loss_bbox"], (first, last)
    assert last["rpn_loss_bbox"] < 0.2 * first["rpn_loss_bbox"], (first, last)
    assert (blobs["bbox_pred"].diff[labels == 0] == 0).all()


# ------------------------------------------------------------------------------------------------
# fork fields through `layerforge convert`

@pytest.mark.parametrize("name", sorted(SSD_NETS) + ["faster_rcnn_vgg16_test.prototxt"])
def test_fork_files_convert_to_yaml_that_reads_back_as_the_same_net(name):
    from layerforge.solvers.caffe_import import convert_file
    from layerforge.yaml_text import to_yaml
    from layerforge.net.netdef import load_net_def
    from layerforge.schema import load_yaml_text
    from tests.caffe.test_convert import layer_view
    kind, mapping, notes = convert_file(str(MODELS / name))
    text = to_yaml(mapping, [f"note: {n}" for n in notes])
    assert kind == "net" and load_yaml_text(text) == mapping
    fork_blocks = {"norm", "permute", "prior_box", "detection_output", "roi_pooling", "python"}
    assert fork_blocks & {block for layer in mapping["layers"] for block in layer}
    from_prototxt = load_net_def(str(MODELS / name))
    from_yaml = load_net_def(load_yaml_text(text))
    assert [layer_view(lp) for lp in from_yaml.layers] == [layer_view(lp) for lp in from_prototxt.layers]
