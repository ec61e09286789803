"""CPMData: OpenPose's training data layer (CMU's caffe_train fork), pictures and their part maps from an LMDB."""
import logging

from .. import rng
from ..data.lmdb_io import LMDBReader
from ..data.pose import MODELS, PoseBatches, PoseTransform, decode_meta
from ..data.transform import resolve_path
from ..errors import DataError
from .base import Field, register_layer
from .data import BaseData, Data

log = logging.getLogger("layerforge")

# keys the fork's CPMTransformationParameter declares and its Transform_nv never reads: (kind, default)
NOT_READ = {"scale": ("float", 1.0), "mirror": ("bool", False), "mean_file": ("str", None),
            "mean_value": ("floats", []), "scale_cvg": ("float", 0.5), "max_cvg_len": ("int", 50),
            "min_cvg_len": ("int", 50), "opaque_coverage": ("bool", True), "coverage": ("str", "gridbox_max"),
            "bbox_norm_factor": ("float", 300.0), "img_header": ("str", "."), "force_color": ("bool", False),
            "force_gray": ("bool", False), "sigma_center": ("float", 21.0)}
# the fork's CPMTransformationParameter
CPM_TRANSFORM = {
    "stride": Field("int", 4, min=1, doc="pixels of the picture per cell of the label maps"),
    "crop_size_x": Field("int", 368, min=1, doc="width of the TRAIN crop (pixels)"),
    "crop_size_y": Field("int", 368, min=1, doc="height of the TRAIN crop (pixels)"),
    "target_dist": Field("float", 1.0, min=0, doc="the person's scale after rescaling: x target_dist / scale"),
    "scale_prob": Field("float", 0.5, min=0, max=1, doc="chance of a random scale multiplier"),
    "scale_min": Field("float", 0.9, min=0, doc="smallest random scale multiplier"),
    "scale_max": Field("float", 1.1, min=0, doc="largest random scale multiplier"),
    "max_rotate_degree": Field("float", 5.0, min=0, doc="rotation drawn in [-max, max] degrees"),
    "center_perterb_max": Field("float", 10.0, min=0, doc="the crop's centre moved by up to this many pixels"),
    "flip_prob": Field("float", 0.5, min=0, max=1, doc="chance of a mirror (left and right parts swapped)"),
    "sigma": Field("float", 7.0, min=0, doc="the confidence maps' Gaussian (pixels)"),
    "num_parts": Field("int", 14, doc="the body model: 56 (COCO, 18 parts) or 43 (MPI, 15 parts)"),
    "np_in_lmdb": Field("int", 16, min=1, doc="joints a person in the records (COCO 17, MPI 16)"),
    "transform_body_joint": Field("bool", True, doc="turn the records' joints into the model's parts"),
    "aug_way": Field("str", "rand", doc="'rand': drawn; 'table': rotations and flips from ../../{rotate,flip}_"
                                        "<num_total_augs>_<records>.txt by record and epoch"),
    "num_total_augs": Field("int", 82, min=1, doc="columns of the aug_way 'table' files"),
    "do_clahe": Field("bool", False, doc="CLAHE on the picture's lightness first"),
    "clahe_tile_size": Field("float", 8.0, min=1, doc="CLAHE's tiles (a side, truncated to an integer)"),
    "clahe_clip_limit": Field("float", 4.0, min=0, doc="CLAHE's clip limit (truncated to an integer)"),
    "gray": Field("int", 0, min=0, doc="1: the picture made grey (3 equal channels)"),
    "visualize": Field("bool", False, doc="write the fork's pictures of each augmented image and its label maps"),
    "crop_size": Field("int", 0, min=0, doc="refused: not CPMData's crop (crop_size_x / crop_size_y are)"),
    **{key: Field(kind, default, doc="not read by the fork's transform") for key, (kind, default) in NOT_READ.items()},
}


@register_layer("CPMData")
class CPMData(BaseData):
    """Pictures and the maps OpenPose learns, from an LMDB of the records the fork's genLMDB.py writes.

    Each record (a Datum of the picture, its metadata, mask_miss and for COCO mask_all; layerforge/data/pose.py)
    is rescaled so the person's scale becomes ``target_dist``, rotated, cropped to crop_size_y x crop_size_x
    around the person's centre and mirrored, with random draws as the fork makes them (TRAIN; in TEST the picture
    stays as it is); made by the decode workers from each picture's own random stream, so a batch is a function
    of the seed and the read position, as Data's.

    Tops: ``data`` (N, C, h, w), C the records' channels: (BGR - 128) / 256 in the first three, 0 in the others
    (the fork's prototxts slice them off); ``label`` (N, 2 (num_parts + 1), h / stride, w / stride): mask_miss /
    255 for the num_parts + 1 first channels, then the part affinity fields, the part confidence maps and the
    background.
    """

    block = "data"
    param_blocks = {"data": Data.param_blocks["data"], "cpm_transform": CPM_TRANSFORM}
    default_shuffle = Data.default_shuffle

    @classmethod
    def validate_params(cls, lp):
        super().validate_params(lp)
        t = lp.cpm_transform
        if t.num_parts not in MODELS:
            raise lp.error(f"num_parts {t.num_parts}: the fork's label maps are made for 56 (COCO) and 43 (MPI)",
                           "cpm_transform.num_parts")
        need = MODELS[t.num_parts]["lmdb_joints"]
        if t.transform_body_joint and t.np_in_lmdb < need:
            raise lp.error(f"np_in_lmdb {t.np_in_lmdb}: num_parts {t.num_parts} is made from {need} joints a person",
                           "cpm_transform.np_in_lmdb")
        if t.aug_way not in ("rand", "table"):
            raise lp.error(f"aug_way '{t.aug_way}': expected 'rand' or 'table'", "cpm_transform.aug_way")
        if t.crop_size:
            raise lp.error("crop_size is not CPMData's crop (the fork leaves its top unshaped): give crop_size_x "
                           "and crop_size_y", "cpm_transform.crop_size")
        if t.scale_min > t.scale_max:
            raise lp.error(f"scale_min {t.scale_min} is larger than scale_max {t.scale_max}", "cpm_transform.scale_min")
        for key in ("crop_size_x", "crop_size_y"):
            if getattr(t, key) < t.stride:
                raise lp.error(f"{key} {getattr(t, key)} is smaller than stride {t.stride}: no label cell",
                               f"cpm_transform.{key}")

    def open_source(self, p):
        try:
            return LMDBReader(resolve_path(p.source))
        except DataError as e:
            raise DataError(f"layer '{self.name}' (CPMData): data.source '{p.source}': {e}") from None

    def layer_setup(self, bottom, top):
        p, t = self.layer_param.data, self.layer_param.cpm_transform
        where = f"layer '{self.name}' (CPMData)"
        for key in NOT_READ:
            if t.given(key):
                log.warning("%s: cpm_transform.%s has no effect: the fork's transform does not read it", where, key)
        self.records = self.open_source(p)
        self.batch_size = p.batch_size
        try:
            first, _ = self.records.read(0)
        except DataError as e:
            raise DataError(f"{where}: {e}") from None
        if first.dtype.name != "uint8" or first.ndim != 3 or first.shape[0] < 5:
            raise DataError(f"{where}: {self.records.name_of(0)}: {first.dtype} values of shape {first.shape}; CPMData "
                            "reads uint8 Datums of 5 or 6 channels (picture, metadata, mask_miss[, mask_all]) as "
                            "the fork's genLMDB.py writes them")
        decode_meta(first[3], t.np_in_lmdb, f"{where}: {self.records.name_of(0)}")
        c, h, w = first.shape
        output = (t.crop_size_y, t.crop_size_x) if self.phase == "TRAIN" else (h, w)
        self.top_shape = (p.batch_size, c) + output
        self.label_shape = (p.batch_size, 2 * (t.num_parts + 1), output[0] // t.stride, output[1] // t.stride)
        shuffle = self.default_shuffle if p.shuffle is None else p.shuffle
        self.stream = PoseBatches(self.records.read, len(self.records), p.batch_size, PoseTransform(t, self.phase),
                                  shuffle, rng.get_rng().integers(2 ** 63), p.rank, p.world_size, first.shape,
                                  self.records.name_of, output, t.visualize)
        self.setup_feed(p, self.records.reopen)
