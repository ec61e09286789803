"""AnnotatedData: the SSD fork's data layer, images with boxes from an LMDB of AnnotatedDatum records."""
from .. import rng
from ..data import shapes
from ..data.annotations import decode_annotated
from ..data.detection_transform import (ANNOTATED_TRANSFORM, BATCH_SAMPLER, AnnotatedBatches, check_params,
                                        check_sampler, new_size)
from ..data.lmdb_io import LMDBReader
from ..data.transform import DataTransformer, resolve_path
from ..errors import DataError
from .base import Field, register_layer
from .data import BaseData, Data


@register_layer("AnnotatedData")
class AnnotatedData(BaseData):
    """Images and their boxes from an LMDB of the SSD fork's AnnotatedDatum records, augmented as the fork does.

    ``layerforge convert_annoset`` writes the records. The augmentation: distortion, expansion, IoU-constrained
    crops (``batch_sampler``), resizing, crop and mirror, the boxes moved along
    (layerforge/data/detection_transform.py). Made by the decode workers; a batch is a function of the seed and
    the read position, as Data's.

    Tops: ``data`` (N, C, h, w), ``(pixel - mean) * scale``; ``label`` the fork's ground-truth list
    (1, 1, K, 8) of rows ``image, label, instance, xmin, ymin, xmax, ymax, difficult`` in [0, 1] (one row of
    -1 when the batch has no box), or, for records without an AnnotationType, their labels (N,). Without
    ``resize_param`` or a crop every batch takes the shape of its images (batch_size 1 for images of several
    sizes), and so with FIT_SMALL_SIZE, which needs batch_size 1.
    """

    block = "data"
    param_blocks = {
        "data": Data.param_blocks["data"],
        "transform": ANNOTATED_TRANSFORM,
        "annotated_data": {
            "batch_sampler": Field([BATCH_SAMPLER], [], doc="the crop samplers (one crop drawn among all kept)"),
            "label_map_file": Field("str", None, doc="the label map (the fork keeps it for its outputs)"),
            "anno_type": Field("enum", None, choices=("BBOX",), doc="replaces every record's AnnotationType"),
        },
    }

    @property
    def default_shuffle(self):
        return self.phase == "TRAIN"

    @classmethod
    def validate_params(cls, lp):
        super().validate_params(lp)
        check_params(lp.transform, lp.error)
        for k, sampler in enumerate(lp.annotated_data.batch_sampler):
            check_sampler(sampler, lp.error, f"annotated_data.batch_sampler[{k}]")
        resize = lp.transform.resize_param
        if lp.transform.given("resize_param") and resize.resize_mode == "FIT_SMALL_SIZE" and lp.data.batch_size != 1:
            raise lp.error("resize_mode FIT_SMALL_SIZE gives every image its own shape: it needs batch_size 1",
                           "data.batch_size")

    def open_source(self, p):
        try:
            return LMDBReader(resolve_path(p.source), decode=decode_annotated)
        except DataError as e:
            hint = " (make it with `layerforge make_example_data shapes`)" \
                if p.source.replace("\\", "/").startswith(f"{shapes.FOLDER}/") else ""
            raise DataError(f"layer '{self.name}' (AnnotatedData): data.source '{p.source}': {e}{hint}") from None

    def layer_setup(self, bottom, top):
        p, t, a = self.layer_param.data, self.layer_param.transform, self.layer_param.annotated_data
        where = f"layer '{self.name}' (AnnotatedData)"
        self.records = self.open_source(p)
        self.batch_size = p.batch_size
        try:
            image, boxes, _, typed = self.records.read(0)
        except DataError as e:
            raise DataError(f"{where}: {e}") from None
        typed = typed or a.anno_type is not None
        self.transformer = DataTransformer(t, self.phase, self.dtype, source=where)
        c, h, w = image.shape
        if t.given("resize_param"):
            h, w = new_size(t.resize_param, h, w)
        crop = (t.crop_size,) * 2 if t.crop_size else (t.crop_h, t.crop_w)
        if crop[0] > 0 and crop[1] > 0:
            h, w = crop
        fixed = (crop[0] > 0 and crop[1] > 0) or (
            t.given("resize_param") and t.resize_param.resize_mode != "FIT_SMALL_SIZE")
        self.top_shape = (p.batch_size, c, h, w)
        self.label_shape = (1, 1, max(len(boxes), 1), 8) if typed else (p.batch_size,)
        shuffle = self.default_shuffle if p.shuffle is None else p.shuffle
        self.stream = AnnotatedBatches(self.records.read, len(self.records), p.batch_size, self.transformer, shuffle,
                                       rng.get_rng().integers(2 ** 63), p.rank, p.world_size, self.records.name_of,
                                       t, a.batch_sampler, self.phase, typed, a.anno_type is not None,
                                       (c, h, w) if fixed else None)
        self.setup_feed(p, self.records.reopen)


    def forward(self, bottom, top):
        super().forward(bottom, top)
        if len(top) > 1:
            self.label_shape = top[1].shape
