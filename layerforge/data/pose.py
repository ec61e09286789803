"""OpenPose's training data (CMU's caffe_train fork, layer ``CPMData``): the records its genLMDB.py writes, the
fork's augmentation, and the maps OpenPose trains on (part confidence maps and part affinity fields).

A record is a Datum of 6 (COCO) or 5 (MPI) uint8 channels of H x W: the BGR picture, a channel of metadata,
``mask_miss`` (0 over people left unannotated, 255 elsewhere) and, for COCO, ``mask_all`` (read by the fork, not
used). The metadata channel is read as rows of W bytes (floats are 4-byte little-endian, coordinates 1-based as
MATLAB writes them):

====================  ===========================================================================
row                   bytes
====================  ===========================================================================
0                     the dataset's name, NUL-terminated ("COCO", "MPI")
1                     float height, float width of the picture
2                     isValidation (byte), numOtherPeople (byte), people_index (byte), then floats
                      annolist_index (at 3), write_number (at 7), total_write_number (at 11)
3                     float x, y of the person's centre (objpos)
4                     float scale of the person (scale_provided)
5, 6, 7               the person's joints: np_in_lmdb floats of x, then of y, then of visibility
8 .. 7+n              the centre (x, y) of each of the n other people
8+n                   their n scales
9+n+3p .. 11+n+3p     the joints of other person p (x, y, visibility rows)
====================  ===========================================================================

Visibility as the fork reads it: 0 labelled but occluded, 1 visible, 2 outside the picture or not labelled,
3 (the person itself only) a part whose mask channel is left out. :func:`encode_meta` writes the channel,
:func:`decode_meta` reads it.

``num_parts`` picks the fork's body model: 56 (COCO: 18 parts, the neck the mean of the shoulders, 19 limbs) or
43 (MPI: 15 parts, 14 limbs). The label of an image (``2 * (num_parts + 1)`` maps of crop / stride) is: the
``mask_miss`` weight for each of the num_parts + 1 first channels, then, for COCO, 38 affinity channels (x, y per
limb), 18 confidence maps and the background (1 - the largest confidence); MPI's are 28, 15 and 1.
"""
import math
import os
import struct
from dataclasses import dataclass

import cv2
import numpy

from ..errors import DataError
from .batches import BatchStream

# the fork's body models, by num_parts: lmdb joints averaged into each part (1-based pairs), left / right pairs
# swapped by a flip (1-based), the limbs (1-based pairs of parts), where the affinity fields and the confidence
# maps start among the label's channels (relative to num_parts)
COCO = dict(
    parts=((1, 1), (6, 7), (7, 7), (9, 9), (11, 11), (6, 6), (8, 8), (10, 10), (13, 13), (15, 15), (17, 17),
           (12, 12), (14, 14), (16, 16), (3, 3), (2, 2), (5, 5), (4, 4)),
    right=(3, 4, 5, 9, 10, 11, 15, 17), left=(6, 7, 8, 12, 13, 14, 16, 18),
    limbs=((2, 9), (9, 10), (10, 11), (2, 12), (12, 13), (13, 14), (2, 3), (3, 4), (4, 5), (3, 17), (2, 6), (6, 7),
           (7, 8), (6, 18), (2, 1), (1, 15), (1, 16), (15, 17), (16, 18)),
    lmdb_joints=17, heat=39)
MPI = dict(
    parts=((10, 10), (9, 9), (13, 13), (12, 12), (11, 11), (14, 14), (15, 15), (16, 16), (3, 3), (2, 2), (1, 1),
           (4, 4), (5, 5), (6, 6), (8, 7)),
    right=(3, 4, 5, 9, 10, 11), left=(6, 7, 8, 12, 13, 14),
    limbs=((1, 2), (2, 3), (3, 4), (4, 5), (2, 6), (6, 7), (7, 8), (2, 15), (15, 9), (9, 10), (10, 11), (15, 12),
           (12, 13), (13, 14)),
    lmdb_joints=16, heat=29)
MODELS = {56: COCO, 43: MPI}
HEATMAP_CUTOFF = 4.6052  # the fork leaves a Gaussian out beyond exp(-4.6052) = 1%
LIMB_WIDTH = 1  # the fork's affinity fields: cells within 1 cell of the limb's line


@dataclass
class Meta:
    """The metadata of one record: people in pixels of the picture, 0-based. Person 0 is the one the record
    is about; ``joints`` (P, K, 2) float32 x, y, ``visible`` (P, K) int, ``centres`` (P, 2) float32."""
    dataset: str
    height: float
    width: float
    is_validation: bool
    people_index: int
    annolist_index: int
    write_number: int
    total_write_number: int
    scale: float
    other_scales: numpy.ndarray
    centres: numpy.ndarray
    joints: numpy.ndarray
    visible: numpy.ndarray


def _floats(row, start, count):
    return numpy.frombuffer(row[start:start + 4 * count].tobytes(), "<f4").copy()


def decode_meta(channel, joints, name="<record>"):
    """The :class:`Meta` of a record's metadata channel (H, W) uint8 with ``joints`` joints a person (np_in_lmdb).
    Joints outside the picture are marked 2 as the fork does. DataError naming ``name`` when it does not fit."""
    height, width = channel.shape
    if width < 4 * joints:
        raise DataError(f"{name}: the metadata rows are {width} bytes, {joints} joints (np_in_lmdb) need "
                        f"{4 * joints}")
    rows = channel.reshape(height, width)

    def row(k):
        if k >= height:
            raise DataError(f"{name}: the metadata needs row {k}, the picture has {height} rows "
                            "(numOtherPeople too large for the picture?)")
        return rows[k]

    name_bytes = row(0).tobytes()
    dataset = name_bytes[:name_bytes.index(0) if 0 in name_bytes else width].decode("latin-1")
    h, w = _floats(row(1), 0, 2)
    counters = row(2)
    others = int(counters[1])
    annolist, write_number, total = _floats(counters, 3, 3)
    centres = numpy.zeros((others + 1, 2), numpy.float32)
    centres[0] = _floats(row(3), 0, 2)
    scale = float(_floats(row(4), 0, 1)[0])
    xy = numpy.zeros((others + 1, joints, 2), numpy.float32)
    seen = numpy.zeros((others + 1, joints), numpy.float32)
    xy[0, :, 0], xy[0, :, 1], seen[0] = (_floats(row(5 + k), 0, joints) for k in range(3))
    for p in range(others):
        centres[p + 1] = _floats(row(8 + p), 0, 2)
    other_scales = _floats(row(8 + others), 0, others) if others else numpy.zeros(0, numpy.float32)
    for p in range(others):
        first = 9 + others + 3 * p
        xy[p + 1, :, 0], xy[p + 1, :, 1], seen[p + 1] = (_floats(row(first + k), 0, joints) for k in range(3))
    centres -= 1  # MATLAB's 1-based pixels
    xy -= 1
    visible = numpy.where(seen == 0, 0, 1)
    visible[0][seen[0] == 3] = 3  # only the person itself keeps a 3
    outside = (xy[..., 0] < 0) | (xy[..., 1] < 0) | (xy[..., 0] >= w) | (xy[..., 1] >= h)
    visible[outside & (visible != 3)] = 2
    return Meta(dataset, float(h), float(w), bool(counters[0]), int(counters[2]), int(annolist), int(write_number),
                int(total), scale, other_scales, centres, xy, visible)


def encode_meta(shape, dataset, centre, scale, joints, others=(), is_validation=False, people_index=0,
                annolist_index=0, write_number=0, total_write_number=1):
    """The metadata channel (H, W) uint8 genLMDB.py writes for a picture of ``shape`` (H, W).

    ``centre`` (x, y) and ``joints`` (K, 3) rows of x, y, visibility are 1-based pixels as in the fork's JSON;
    ``others`` lists ``(centre, scale, joints)`` of the other people."""
    height, width = shape
    channel = numpy.zeros((height, width), numpy.uint8)

    def put(k, start, values):
        data = struct.pack(f"<{len(values)}f", *values)
        if k >= height or start + len(data) > width:
            raise ValueError(f"the metadata does not fit a picture of {height}x{width}")
        channel[k, start:start + len(data)] = numpy.frombuffer(data, numpy.uint8)

    channel[0, :len(dataset)] = numpy.frombuffer(dataset.encode("latin-1"), numpy.uint8)
    put(1, 0, [height, width])
    channel[2, :3] = [int(is_validation), len(others), people_index]
    put(2, 3, [annolist_index, write_number, total_write_number])
    put(3, 0, list(centre))
    put(4, 0, [scale])
    for k, column in enumerate(numpy.asarray(joints, numpy.float64).T):
        put(5 + k, 0, column.tolist())
    for p, (c, _, _) in enumerate(others):
        put(8 + p, 0, list(c))
    if others:
        put(8 + len(others), 0, [s for _, s, _ in others])
    for p, (_, _, j) in enumerate(others):
        for k, column in enumerate(numpy.asarray(j, numpy.float64).T):
            put(9 + len(others) + 3 * p + k, 0, column.tolist())
    return channel


def body_parts(meta, model):
    """The fork's TransformJoints: ``meta`` with its lmdb joints turned into the model's parts (each the mean of a
    pair; visibility 2 if either is 2, else 3 if either is 3, else 1 only if both are nonzero)."""
    pairs = numpy.array(model["parts"]) - 1
    a, b = meta.joints[:, pairs[:, 0]], meta.joints[:, pairs[:, 1]]
    va, vb = meta.visible[:, pairs[:, 0]], meta.visible[:, pairs[:, 1]]
    visible = numpy.where((va == 2) | (vb == 2), 2, numpy.where((va == 3) | (vb == 3), 3, (va != 0) & (vb != 0)))
    meta.joints, meta.visible = ((a + b) * numpy.float32(0.5)).astype(numpy.float32), visible.astype(int)
    return meta


def c_round(value):
    """C's round(): halves away from zero."""
    return math.floor(value + 0.5) if value >= 0 else -math.floor(-value + 0.5)


def bounding_size(width, height, degree):
    """OpenCV's RotatedRect(centre, (width, height), degree).boundingRect() size: (w, h) in whole pixels."""
    corners = cv2.boxPoints(((width / 2.0, height / 2.0), (width, height), degree))
    low, high = corners.min(axis=0), corners.max(axis=0)
    return int(math.ceil(high[0]) - math.floor(low[0]) + 1), int(math.ceil(high[1]) - math.floor(low[1]) + 1)


@dataclass
class Augmentation:
    """What the fork drew for one image: the scale multiplier, the rotation (degrees), the crop's centre shift
    (pixels) and the flip."""
    scale: float = 1.0
    degree: float = 0.0
    shift: tuple = (0, 0)
    flip: bool = False


class PoseTransform:
    """The fork's CPMDataTransformer (Transform_nv, mode 5) for one record.

    Args:
        t: the validated ``cpm_transform`` block.
        phase: "TRAIN" (augmented and cropped) or "TEST" (the picture as it is).
    """

    def __init__(self, t, phase):
        self.t, self.train = t, phase == "TRAIN"
        self.model = MODELS[t.num_parts]
        self.tables = {}  # aug_way table: kind -> (records, num_total_augs) array, read at first use

    def label_channels(self):
        return 2 * (self.t.num_parts + 1)

    def __call__(self, record, name, r, epoch=0):
        """``(picture (3, h, w) uint8, label (2 (np + 1), h / stride, w / stride) float32, meta, Augmentation)``
        of ``record`` (C, H, W) uint8, drawing from the numpy Generator ``r`` in the fork's order."""
        t = self.t
        image = numpy.ascontiguousarray(record[:3].transpose(1, 2, 0))
        mask = numpy.ascontiguousarray(record[4])
        if t.do_clahe:
            image = clahe(image, int(t.clahe_tile_size), int(t.clahe_clip_limit))
        if t.gray == 1:
            image = cv2.cvtColor(cv2.cvtColor(image, cv2.COLOR_BGR2GRAY), cv2.COLOR_GRAY2BGR)
        meta = decode_meta(record[3], t.np_in_lmdb, name)
        if t.transform_body_joint:
            meta = body_parts(meta, self.model)
        else:
            meta.joints, meta.visible = _padded(meta.joints, meta.visible, len(self.model["parts"]))
        aug = Augmentation()
        if self.train:
            if not meta.scale > 0:
                raise DataError(f"{name}: the person's scale (scale_provided) is {meta.scale}; it must be > 0")
            image, mask, aug.scale = self.rescale(image, mask, meta, r)
            image, mask, aug.degree = self.rotate(image, mask, meta, r, epoch)
            image, mask, aug.shift = self.crop(image, mask, meta, r)
            image, mask, aug.flip = self.mirror(image, mask, meta, r, epoch)
        label = self.label(mask, meta, image.shape[:2])
        return image.transpose(2, 0, 1), label, meta, aug

    def rescale(self, image, mask, meta, r):
        t = self.t
        multiplier = 1.0
        if not r.random() > t.scale_prob:
            multiplier = float(numpy.float32((t.scale_max - t.scale_min) * r.random() + t.scale_min))
        scale = float(numpy.float32(t.target_dist / meta.scale) * numpy.float32(multiplier))
        image = cv2.resize(image, None, fx=scale, fy=scale, interpolation=cv2.INTER_CUBIC)
        mask = cv2.resize(mask, None, fx=scale, fy=scale, interpolation=cv2.INTER_CUBIC)
        _move(meta, lambda p: p * numpy.float32(scale))
        return image, mask, multiplier

    def rotate(self, image, mask, meta, r, epoch):
        if self.t.aug_way == "table":
            degree = float(self.table("rotate", meta, epoch))
        else:
            degree = float(numpy.float32((r.random() - 0.5) * 2 * self.t.max_rotate_degree))
        height, width = image.shape[:2]
        centre = (width / 2.0, height / 2.0)
        rotation = cv2.getRotationMatrix2D(centre, degree, 1.0)
        w, h = bounding_size(width, height, degree)
        rotation[0, 2] += w / 2.0 - centre[0]
        rotation[1, 2] += h / 2.0 - centre[1]
        image = cv2.warpAffine(image, rotation, (w, h), flags=cv2.INTER_CUBIC, borderMode=cv2.BORDER_CONSTANT,
                               borderValue=(128, 128, 128))
        mask = cv2.warpAffine(mask, rotation, (w, h), flags=cv2.INTER_CUBIC, borderMode=cv2.BORDER_CONSTANT,
                              borderValue=255)
        _move(meta, lambda p: (p.astype(numpy.float64) @ rotation[:, :2].T + rotation[:, 2]).astype(numpy.float32))
        return image, mask, degree

    def crop(self, image, mask, meta, r):
        t = self.t
        shift = [int((r.random() - 0.5) * 2 * t.center_perterb_max) for _ in range(2)]
        centre = numpy.rint(meta.centres[0] + numpy.array(shift, numpy.float32)).astype(int)  # OpenCV's cvRound
        left, top = int(centre[0]) - t.crop_size_x // 2, int(centre[1]) - t.crop_size_y // 2
        out = numpy.full((t.crop_size_y, t.crop_size_x, 3), 128, numpy.uint8)
        out_mask = numpy.full((t.crop_size_y, t.crop_size_x), 255, numpy.uint8)
        y0, x0 = max(top, 0), max(left, 0)
        y1, x1 = min(top + t.crop_size_y, image.shape[0]), min(left + t.crop_size_x, image.shape[1])
        if y1 > y0 and x1 > x0:
            out[y0 - top:y1 - top, x0 - left:x1 - left] = image[y0:y1, x0:x1]
            out_mask[y0 - top:y1 - top, x0 - left:x1 - left] = mask[y0:y1, x0:x1]
        offset = numpy.array([-left, -top], numpy.float32)
        _move(meta, lambda p: p + offset)
        return out, out_mask, tuple(shift)

    def mirror(self, image, mask, meta, r, epoch):
        if self.t.aug_way == "table":
            flip = self.table("flip", meta, epoch) == 1
        else:
            flip = r.random() <= self.t.flip_prob
        if not flip:
            return image, mask, False
        width = numpy.float32(image.shape[1] - 1)
        meta.centres[:, 0] = width - meta.centres[:, 0]
        meta.joints[..., 0] = width - meta.joints[..., 0]
        if self.t.transform_body_joint:
            right, left = numpy.array(self.model["right"]) - 1, numpy.array(self.model["left"]) - 1
            for values in (meta.joints, meta.visible):
                values[:, right], values[:, left] = values[:, left].copy(), values[:, right].copy()
        return numpy.ascontiguousarray(image[:, ::-1]), numpy.ascontiguousarray(mask[:, ::-1]), True

    def table(self, kind, meta, epoch):
        """The fork's ``aug_way: table`` entry of ``kind`` ("rotate", "flip") for this record and epoch: row
        write_number, column epoch % num_total_augs of ../../{kind}_{num_total_augs}_{total}.txt (from the
        working directory, as the fork reads it)."""
        augs, total = self.t.num_total_augs, meta.total_write_number
        if kind not in self.tables:
            path = os.path.join("..", "..", f"{kind}_{augs}_{total}.txt")
            try:
                with open(path) as f:
                    values = numpy.array(f.read().split(), numpy.float64)
            except (OSError, ValueError) as e:
                raise DataError(f"{path}: the {kind} table of aug_way 'table' cannot be read: {e}") from None
            if values.size < augs * total:
                raise DataError(f"{path}: {values.size} values, aug_way 'table' needs {total} rows of {augs}")
            self.tables[kind] = values[:augs * total].reshape(total, augs)
        if not 0 <= meta.write_number < total:
            raise DataError(f"the record's write_number {meta.write_number} is outside the {kind} table's "
                            f"{total} rows")
        return self.tables[kind][meta.write_number, epoch % augs]

    def label(self, mask, meta, size):
        """The fork's label of an augmented picture of ``size`` (h, w): weights from ``mask`` (h, w), then the
        affinity fields, the confidence maps and the background (module docstring)."""
        t, model = self.t, self.model
        stride, parts = t.stride, t.num_parts
        grid_y, grid_x = size[0] // stride, size[1] // stride
        small = cv2.resize(mask, None, fx=1.0 / stride, fy=1.0 / stride, interpolation=cv2.INTER_CUBIC)
        weight = small[:grid_y, :grid_x].astype(numpy.float32) / numpy.float32(255)
        label = numpy.zeros((2 * (parts + 1), grid_y, grid_x), numpy.float32)
        # the fork leaves a part marked 3 to what its buffer held; here it weighs nothing
        own = numpy.zeros(parts, int)
        own[:meta.visible.shape[1]] = meta.visible[0]
        label[:parts][own != 3] = weight
        label[parts] = weight
        heat = label[parts + model["heat"]:parts + model["heat"] + len(model["parts"])]
        for i in range(len(model["parts"])):
            for p in range(len(meta.joints)):
                if meta.visible[p, i] <= 1:
                    gaussian_into(heat[i], meta.joints[p, i], stride, t.sigma)
        for k, (a, b) in enumerate(model["limbs"]):
            for p in range(len(meta.joints)):
                if meta.visible[p, a - 1] <= 1 and meta.visible[p, b - 1] <= 1:
                    affinity_into(label[parts + 1 + 2 * k], label[parts + 2 + 2 * k], meta.joints[p, a - 1],
                                  meta.joints[p, b - 1], stride)
        label[2 * parts + 1] = numpy.maximum(1 - numpy.maximum(heat.max(axis=0), 0), 0)
        return label


def gaussian_into(heat, centre, stride, sigma):
    """Add to ``heat`` (gy, gx) the fork's Gaussian of ``sigma`` pixels at ``centre`` (x, y pixels), sampled at the
    cells' centres (stride / 2 - 0.5 + g * stride), left out beyond 1%, the sum clipped at 1."""
    start = stride / 2.0 - 0.5
    grid_y, grid_x = heat.shape
    x = numpy.float32(start) + numpy.arange(grid_x, dtype=numpy.float32) * stride
    y = numpy.float32(start) + numpy.arange(grid_y, dtype=numpy.float32) * stride
    d2 = (y[:, None] - centre[1]) ** 2 + (x[None, :] - centre[0]) ** 2
    exponent = (d2.astype(numpy.float64) / 2.0 / sigma / sigma).astype(numpy.float32)
    inside = exponent <= HEATMAP_CUTOFF
    heat[inside] = numpy.minimum(heat[inside] + numpy.exp(-exponent[inside]), 1)


def affinity_into(field_x, field_y, a, b, stride):
    """Write into ``field_x``, ``field_y`` (gy, gx) the unit vector from joint ``a`` to joint ``b`` (x, y pixels)
    on the cells within one cell of the limb's line (between the joints' cells, widened by one), as the fork
    does: a later person's limb overwrites an earlier one's where they meet."""
    a = numpy.asarray(a, numpy.float32) / numpy.float32(stride)
    b = numpy.asarray(b, numpy.float32) / numpy.float32(stride)
    grid_y, grid_x = field_x.shape
    direction = b - a
    with numpy.errstate(invalid="ignore", divide="ignore"):  # joints on one spot: no direction, nothing written
        direction = direction / numpy.float32(math.sqrt(float(direction[0]) ** 2 + float(direction[1]) ** 2))
    x0 = max(c_round(float(min(a[0], b[0])) - LIMB_WIDTH), 0)
    x1 = min(c_round(float(max(a[0], b[0])) + LIMB_WIDTH), grid_x)
    y0 = max(c_round(float(min(a[1], b[1])) - LIMB_WIDTH), 0)
    y1 = min(c_round(float(max(a[1], b[1])) + LIMB_WIDTH), grid_y)
    if x1 <= x0 or y1 <= y0:
        return
    gx = numpy.arange(x0, x1, dtype=numpy.float32)[None, :] - a[0]
    gy = numpy.arange(y0, y1, dtype=numpy.float32)[:, None] - a[1]
    with numpy.errstate(invalid="ignore"):
        near = numpy.abs(gx * direction[1] - gy * direction[0]) <= LIMB_WIDTH
    field_x[y0:y1, x0:x1][near] = direction[0]
    field_y[y0:y1, x0:x1][near] = direction[1]


def clahe(image, tile, clip):
    """The fork's contrast step: CLAHE on the L channel of Lab (``tile`` x ``tile`` tiles, clip limit ``clip``)."""
    lab = cv2.cvtColor(image, cv2.COLOR_BGR2Lab)
    lab[..., 0] = cv2.createCLAHE(clipLimit=clip, tileGridSize=(tile, tile)).apply(numpy.ascontiguousarray(lab[..., 0]))
    return cv2.cvtColor(lab, cv2.COLOR_Lab2BGR)


def _move(meta, f):
    meta.centres = f(meta.centres)
    meta.joints = f(meta.joints.reshape(-1, 2)).reshape(meta.joints.shape)


def _padded(joints, visible, count):
    """Joints used as the lmdb has them (transform_body_joint false), cut or padded (at 0, visibility 0) to
    ``count`` a person."""
    people, have = visible.shape
    out_j = numpy.zeros((people, count, 2), numpy.float32)
    out_v = numpy.zeros((people, count), int)
    out_j[:, :min(have, count)], out_v[:, :min(have, count)] = joints[:, :count], visible[:, :count]
    return out_j, out_v


class PoseBatches(BatchStream):
    """Batches of the CPMData layer: which records, planned from (seed, position) as BatchStream does, and how a
    decode worker makes one picture and its label (:class:`PoseTransform`, from a random stream of its own).

    Args (beyond BatchStream's; ``transform`` is the :class:`PoseTransform`):
        shape: (C, H, W) of the first record; in TEST every record must have it.
        output: (h, w) of the pictures (the crop in TRAIN, the records' size in TEST).
        visualize: write the fork's pictures of each augmented image and its label maps (working directory).
    """

    def __init__(self, read, size, batch_size, transform, shuffle, seed, rank, world_size, shape, name_of, output,
                 visualize=False):
        super().__init__(read, size, batch_size, transform, shuffle, seed, rank, world_size, shape=shape,
                         name_of=name_of)
        self.output, self.visualize = tuple(output), visualize

    def layout(self):
        """The pictures (N, 3, h, w) uint8 and the labels (N, 2 (np + 1), h / stride, w / stride) float32."""
        (h, w), n, stride = self.output, self.batch_size, self.transform.t.stride
        return [((n, 3, h, w), numpy.uint8), ((n, self.transform.label_channels(), h // stride, w // stride),
                                              numpy.float32)]

    def plan(self, position):
        """``(items, None)``: per picture i, ``(i, record index, seed of its randomness, epoch, read count)``."""
        n, per = self.batch_size, len(self.shard)
        seeds = numpy.random.default_rng([self.seed, 1, position]).integers(2 ** 63, size=n).tolist()
        indices = self.indices(position, n)
        return [(i, indices[i], seeds[i], (position + i) // per, position + i) for i in range(n)], None

    def fill(self, arrays, item):
        i, index, seed, epoch, count = item
        record, _ = self.read(index)
        name = self.name_of(index)
        if record.dtype != numpy.uint8 or record.ndim != 3 or record.shape[0] != self.shape[0]:
            raise DataError(f"{name}: {record.dtype} values of shape {record.shape}; CPMData reads uint8 records of "
                            f"{self.shape[0]} channels (picture, metadata, mask_miss[, mask_all]) as the first one")
        if not self.transform.train and record.shape != self.shape:
            raise DataError(f"{name}: shape {record.shape} differs from the first record's {self.shape}; in TEST "
                            "CPMData keeps each picture whole, so all must have one size")
        image, label, meta, aug = self.transform(record, name, numpy.random.default_rng(seed), epoch)
        arrays[0][i] = image
        arrays[1][i] = label
        if self.visualize:
            visualize(image, label, meta, aug, count, epoch, self.transform)

    def finish(self, xp, arrays, extra, outs):
        """The tops: the pictures as the fork gives them, (BGR - 128) / 256 in the first 3 channels and 0 in the
        others, and the labels."""
        data = outs[0]
        data[:, :3] = (arrays[0].astype(data.dtype) - 128) / 256
        data[:, 3:] = 0
        if len(outs) > 1:
            outs[1][...] = arrays[1]


def visualize(image, label, meta, aug, count, epoch, transform):
    """The fork's ``visualize``: the augmented picture with the people's centres, visible parts and the crop's box
    (augment_<count>_epoch_<epoch>_writenum_<n>.jpg, TRAIN), and every label map over the picture
    (augment_<n>_label_part_<channel>.jpg), in the working directory."""
    picture = numpy.ascontiguousarray(image.transpose(1, 2, 0))
    stride = transform.t.stride
    for name, layer in enumerate(label):
        heat = cv2.resize((layer * 255).astype(numpy.uint8), None, fx=stride, fy=stride,
                          interpolation=cv2.INTER_LINEAR)
        heat = cv2.applyColorMap(heat[:picture.shape[0], :picture.shape[1]], cv2.COLORMAP_JET)
        blend = cv2.addWeighted(heat, 0.5, picture[:heat.shape[0], :heat.shape[1]], 0.5, 0.0)
        cv2.imwrite(f"augment_{meta.write_number:04d}_label_part_{name:02d}.jpg", blend)
    if not transform.train:
        return
    shown = picture.copy()
    centre = tuple(int(round(v)) for v in meta.centres[0])
    cv2.rectangle(shown, (centre[0] - 3, centre[1] - 3), (centre[0] + 3, centre[1] + 3), (0, 255, 255), -1)
    half_x, half_y = transform.t.crop_size_x // 2, transform.t.crop_size_y // 2
    cv2.rectangle(shown, (centre[0] - half_x, centre[1] - half_y), (centre[0] + half_x, centre[1] + half_y),
                  (0, 255, 0), 2)
    for p in range(len(meta.joints)):
        if p:
            c = tuple(int(round(v)) for v in meta.centres[p])
            cv2.rectangle(shown, (c[0] - 3, c[1] - 3), (c[0] + 3, c[1] + 3), (255, 255, 0), -1)
        for joint, seen in zip(meta.joints[p], meta.visible[p]):
            if seen <= 1:
                cv2.circle(shown, tuple(int(round(v)) for v in joint), 3, (255, 200, 200) if p == 0 else (255, 0, 0),
                           -1)
    lines = (f"{meta.dataset} {meta.write_number} index:{meta.annolist_index}; p:{meta.people_index}; "
             f"o_scale: {meta.scale:g}",
             f"mult: {aug.scale:g}; rot: {aug.degree:g}; flip: {'true' if aug.flip else 'ori'}")
    for k, text in enumerate(lines):
        (w, h), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, 0.5, 1)
        y = 20 * (k + 1)
        cv2.rectangle(shown, (0, y + base), (w, y - h), (0, 0, 0), -1)
        cv2.putText(shown, text, (0, y), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (255, 255, 255), 1)
    cv2.imwrite(f"augment_{count:04d}_epoch_{epoch:03d}_writenum_{meta.write_number:03d}.jpg", shown)
