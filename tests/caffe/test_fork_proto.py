"""The Caffe forks' messages in layerforge.caffe.caffe_pb: SSD (weiliu89/caffe, branch ssd), Fast R-CNN, SegNet, ENet.

The numbers, labels, types and defaults were transcribed from each fork's caffe.proto; these tests pin the facts a
fork's files depend on (field numbers of LayerParameter, enum values, defaults) and what happens to the fields
whose numbers BVLC uses for something else.
"""
import numpy
import pytest
from google.protobuf import text_format

from layerforge.caffe import caffe_pb
from layerforge.caffe.caffemodel import array_to_blob

SSD_HEAD = """name: "ssd"
input: "data"
input_shape { dim: 1 dim: 3 dim: 300 dim: 300 }
layer { name: "conv4_3_norm" type: "Normalize" bottom: "conv4_3" top: "conv4_3_norm"
  norm_param { across_spatial: false scale_filler { type: "constant" value: 20 } channel_shared: false } }
layer { name: "perm" type: "Permute" bottom: "loc" top: "perm" permute_param { order: 0 order: 2 order: 3 order: 1 } }
layer { name: "prior" type: "PriorBox" bottom: "conv4_3_norm" bottom: "data" top: "prior"
  prior_box_param { min_size: 30.0 max_size: 60.0 aspect_ratio: 2 flip: true clip: false
    variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 step: 8 offset: 0.5 } }
layer { name: "detection_out" type: "DetectionOutput" bottom: "mbox_loc" bottom: "mbox_conf_flatten"
  bottom: "mbox_priorbox" top: "detection_out" include { phase: TEST }
  detection_output_param { num_classes: 21 share_location: true background_label_id: 0
    nms_param { nms_threshold: 0.45 top_k: 400 } code_type: CENTER_SIZE keep_top_k: 200
    confidence_threshold: 0.01 } }
"""


def number(message, field):
    return getattr(caffe_pb, message).DESCRIPTOR.fields_by_name[field].number


def test_ssd_layer_parameter_fields_have_the_forks_numbers():
    assert {f: number("LayerParameter", f) for f in (
        "annotated_data_param", "multibox_loss_param", "permute_param", "prior_box_param", "detection_output_param",
        "detection_evaluate_param", "norm_param", "video_data_param")} == {
        "annotated_data_param": 200, "multibox_loss_param": 201, "permute_param": 202, "prior_box_param": 203,
        "detection_output_param": 204, "detection_evaluate_param": 205, "norm_param": 206, "video_data_param": 207}
    assert {f: number("TransformationParameter", f) for f in (
        "resize_param", "noise_param", "emit_constraint", "crop_h", "crop_w", "distort_param", "expand_param")} == {
        "resize_param": 8, "noise_param": 9, "emit_constraint": 10, "crop_h": 11, "crop_w": 12, "distort_param": 13,
        "expand_param": 14}
    assert number("SolverParameter", "plateau_winsize") == 43 and number("SolverParameter", "show_per_class_result") == 44


def test_ssd_defaults_and_enums():
    prior = caffe_pb.PriorBoxParameter()
    assert (prior.flip, prior.clip, prior.offset, list(prior.variance)) == (True, False, 0.5, [])
    assert (caffe_pb.PriorBoxParameter.CORNER, caffe_pb.PriorBoxParameter.CENTER_SIZE,
            caffe_pb.PriorBoxParameter.CORNER_SIZE) == (1, 2, 3)
    out = caffe_pb.DetectionOutputParameter()
    assert (out.share_location, out.background_label_id, out.keep_top_k, out.code_type,
            out.variance_encoded_in_target) == (True, 0, -1, caffe_pb.PriorBoxParameter.CORNER, False)
    nms = caffe_pb.NonMaximumSuppressionParameter()
    assert (nms.nms_threshold, nms.eta, nms.HasField("top_k")) == (pytest.approx(0.3), 1.0, False)
    norm = caffe_pb.NormalizeParameter()
    assert (norm.across_spatial, norm.channel_shared, norm.eps) == (True, True, pytest.approx(1e-10))
    loss = caffe_pb.MultiBoxLossParameter()
    assert (loss.loc_loss_type, loss.conf_loss_type, loss.match_type, loss.mining_type) == (
        caffe_pb.MultiBoxLossParameter.SMOOTH_L1, caffe_pb.MultiBoxLossParameter.SOFTMAX,
        caffe_pb.MultiBoxLossParameter.PER_PREDICTION, caffe_pb.MultiBoxLossParameter.MAX_NEGATIVE)
    assert (loss.neg_pos_ratio, loss.neg_overlap, loss.sample_size, number("MultiBoxLossParameter",
                                                                           "encode_variance_in_target")) == (3.0, 0.5, 64, 16)
    assert (caffe_pb.BatchSampler().max_trials, caffe_pb.BatchSampler().use_original_image) == (100, True)
    assert caffe_pb.Sampler().min_scale == 1.0 and caffe_pb.ExpansionParameter().max_expand_ratio == 1.0
    resize = caffe_pb.ResizeParameter()
    assert (resize.prob, resize.resize_mode, resize.pad_mode) == (1.0, caffe_pb.ResizeParameter.WARP,
                                                                  caffe_pb.ResizeParameter.CONSTANT)
    assert caffe_pb.ResizeParameter.LANCZOS4 == 5 and caffe_pb.NoiseParameter().jpeg == -1.0
    assert caffe_pb.EmitConstraint().emit_type == caffe_pb.EmitConstraint.CENTER
    assert caffe_pb.AnnotatedDatum.BBOX == 0 and caffe_pb.DetectionEvaluateParameter().evaluate_difficult_gt
    assert caffe_pb.SolverState().minimum_loss == pytest.approx(1e38) and caffe_pb.VideoDataParameter.VIDEO == 1


def test_an_ssd_deploy_text_parses_and_round_trips():
    net = text_format.Parse(SSD_HEAD, caffe_pb.NetParameter())
    norm, perm, prior, out = (layer for layer in net.layer)
    assert norm.norm_param.scale_filler.value == 20 and not norm.norm_param.channel_shared
    assert list(perm.permute_param.order) == [0, 2, 3, 1]
    assert list(prior.prior_box_param.variance) == pytest.approx([0.1, 0.1, 0.2, 0.2])
    assert prior.prior_box_param.step == 8 and list(prior.prior_box_param.aspect_ratio) == [2]
    p = out.detection_output_param
    assert (p.num_classes, p.nms_param.top_k, p.keep_top_k, p.code_type) == (21, 400, 200, 2)
    assert p.nms_param.nms_threshold == pytest.approx(0.45) and p.confidence_threshold == pytest.approx(0.01)
    assert caffe_pb.NetParameter.FromString(net.SerializeToString()) == net


def test_annotated_datum_round_trips():
    record = caffe_pb.AnnotatedDatum(type=caffe_pb.AnnotatedDatum.BBOX)
    record.datum.channels, record.datum.height, record.datum.width, record.datum.encoded = 3, 2, 2, True
    group = record.annotation_group.add(group_label=7)
    group.annotation.add(instance_id=0, bbox=caffe_pb.NormalizedBBox(xmin=0.1, ymin=0.2, xmax=0.5, ymax=0.9,
                                                                       difficult=True))
    back = caffe_pb.AnnotatedDatum.FromString(record.SerializeToString())
    box = back.annotation_group[0].annotation[0].bbox
    assert back.annotation_group[0].group_label == 7 and box.difficult
    assert (box.xmin, box.ymax) == (pytest.approx(0.1), pytest.approx(0.9)) and back.datum.encoded
    assert caffe_pb.AnnotatedDataParameter.DESCRIPTOR.fields_by_name["anno_type"].enum_type.full_name == \
        "caffe.AnnotatedDatum.AnnotationType"


def test_the_other_forks_layer_messages():
    assert number("LayerParameter", "bn_param") == 45 and caffe_pb.BNParameter().bn_mode == caffe_pb.BNParameter.LEARN
    assert caffe_pb.BNParameter.INFERENCE == 1
    up = caffe_pb.UpsampleParameter()
    assert (up.scale, up.pad_out_h, number("UpsampleParameter", "upsample_h"),
            number("UpsampleParameter", "upsample_w")) == (2, False, 6, 7)
    assert number("LayerParameter", "roi_pooling_param") == 8266711
    assert number("LayerParameter", "smooth_l1_loss_param") == 8266712
    roi = caffe_pb.ROIPoolingParameter()
    assert (roi.pooled_h, roi.pooled_w, roi.spatial_scale) == (0, 0, 1.0)
    assert caffe_pb.DropoutParameter().scale_train is True
    assert number("LayerParameter", "dense_image_data_param") == 46  # ENet's (SegNet's 138 is BVLC's tile_param)


def test_opencvs_own_fields():
    # opencv-caffe.proto, as the descriptor in OpenCV 4's cv2 module has them
    assert [number("PriorBoxParameter", f) for f in ("offset_h", "offset_w", "width", "height")] == [14, 15, 16, 17]
    assert number("DetectionOutputParameter", "clip") == 1000 and caffe_pb.DetectionOutputParameter().clip is False
    assert caffe_pb.BatchNormParameter().scale_bias is False
    assert caffe_pb.fork_of("DetectionOutputParameter", "normalized_bbox") == ["opencv"]  # 10 is SSD's visualize


def test_fork_of_names_the_forks():
    assert caffe_pb.fork_of("LayerParameter", "norm_param") == ["ssd"]
    assert caffe_pb.fork_of("PriorBoxParameter") == ["ssd"] and caffe_pb.fork_of("PriorBoxParameter.CodeType") == ["ssd"]
    assert caffe_pb.fork_of("LayerParameter", "upsample_param") == ["segnet", "enet"]
    assert caffe_pb.fork_of("ROIPoolingParameter") == ["fast-rcnn"]
    assert caffe_pb.fork_of("LayerParameter", "convolution_param") == [] and caffe_pb.fork_of("NetParameter") == []
    assert set(caffe_pb.FORKS) == {"ssd", "fast-rcnn", "segnet", "enet", "opencv", "openpose"}
    assert caffe_pb.forks_of_layer_type("SmoothL1Loss") == ["ssd", "fast-rcnn"]
    assert caffe_pb.forks_of_layer_type("Convolution") == []


def test_fields_whose_numbers_bvlc_uses_are_left_out_and_listed():
    clashes = {(fork, message, field[0], field[1]): other[0] for fork, message, field, other in caffe_pb.CLASHES}
    assert clashes[("segnet", "LayerParameter", "upsample_param", 137)] == "embed_param"
    assert clashes[("enet", "LayerParameter", "upsample_param", 147)] == "swish_param"
    assert clashes[("openpose", "LayerParameter", "cpm_transform_param", 147)] == "swish_param"
    assert clashes[("ssd", "SolverParameter", "eval_type", 41)] == "layer_wise_reduce"
    assert clashes[("ssd", "SolverParameter", "ap_version", 42)] == "weights"
    assert "upsample_param" not in caffe_pb.LayerParameter.DESCRIPTOR.fields_by_name
    assert number("SolverParameter", "layer_wise_reduce") == 41  # BVLC's stays


def _field(number, payload):
    """A length-delimited protobuf field (wire type 2)."""
    key, out = number << 3 | 2, b""
    for n in (key, len(payload)):
        while True:
            out += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
            n >>= 7
            if not n:
                break
    return out + payload


@pytest.mark.parametrize("fork, number_", [("segnet", 137), ("enet", 147)])
def test_a_fork_caffemodel_with_an_upsample_layer_reads(fork, number_):
    # upsample_param { scale: 2 pad_out_h: true upsample_w: 30 }: varints where embed_param / swish_param differ
    upsample = bytes([1 << 3, 2, 4 << 3, 1, 7 << 3, 30])
    conv = caffe_pb.LayerParameter(name="conv", type="Convolution")
    conv.blobs.append(array_to_blob(numpy.ones((2, 1, 1, 1), numpy.float32)))
    layer = caffe_pb.LayerParameter(name="up", type="Upsample").SerializeToString() + _field(number_, upsample)
    data = _field(100, conv.SerializeToString()) + _field(100, layer)
    net = caffe_pb.NetParameter.FromString(data)
    assert [(lp.name, lp.type, len(lp.blobs)) for lp in net.layer] == [("conv", "Convolution", 1),
                                                                        ("up", "Upsample", 0)]
