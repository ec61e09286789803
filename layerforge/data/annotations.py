"""Images with boxes: the SSD fork's AnnotatedDatum records, label maps, and its annotation files (VOC XML, JSON, TXT).

An AnnotatedDatum (the fork's caffe.proto, layerforge/caffe/caffe_pb.py) holds a Datum, an AnnotationType
(BBOX) and AnnotationGroups, one per class, of Annotations (an instance id and a NormalizedBBox: corners as
fractions of the image, a ``difficult`` flag). Here the boxes of a record are one (k, 7) float32 array,
:data:`BOX_COLUMNS`, in the record's order (group by group); the groups are rebuilt from it when writing
(one per label, in order of first appearance, as the fork's readers make them).

The annotation files, as the fork's ``convert_annoset`` reads them (``util/io.cpp``):

- ``xml``: PASCAL VOC. ``annotation/size/{height,width}`` (the image's own size when missing) and an
  ``object`` per box: ``name`` (looked up in the label map), ``difficult`` (``1``) and ``bndbox`` with pixel
  ``xmin ymin xmax ymax``, divided by the width and height. Children are read in document order, as the fork
  does: a ``difficult`` after the ``bndbox`` does not count.
- ``json``: ``image/{height,width}`` and an ``annotation`` list of ``{category_id, bbox: [x, y, w, h], iscrowd}``
  (``category_id`` looked up in the label map as a name; ``iscrowd`` becomes ``difficult``).
- ``txt``: lines ``label xmin ymin xmax ymax`` in pixels, the label a number.

Within a class, instance ids count up from 0 in file order.
"""
import json
import logging
import os
import xml.etree.ElementTree as ElementTree

import numpy
from google.protobuf import text_format
from google.protobuf.message import DecodeError

from ..caffe.caffe_pb import AnnotatedDatum, LabelMap
from ..errors import DataError
from . import read_text
from .datum import array_to_datum, datum_to_array, encoded_datum
from .images import decode_image, encoded_bytes, read_pair_list_file
from .lmdb_io import write_lmdb_atomic

log = logging.getLogger("layerforge")

BOX_COLUMNS = ("label", "instance_id", "xmin", "ymin", "xmax", "ymax", "difficult")
LABEL_TYPES = ("xml", "json", "txt")


def no_boxes():
    return numpy.zeros((0, len(BOX_COLUMNS)), numpy.float32)


def decode_annotated(value, source="<record>", key=b"?"):
    """``(image (C, H, W), boxes (k, 7) float32, label, typed)`` from a serialized AnnotatedDatum.

    ``typed`` tells whether the record has an AnnotationType (else its ``label`` is the datum's, and it has no
    boxes). DataError naming ``source`` and ``key`` for a record that is no AnnotatedDatum or is corrupted.
    """
    k = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
    where = f"{source}: key '{k}'"
    anno = AnnotatedDatum()
    try:
        anno.ParseFromString(bytes(value))
    except DecodeError as e:
        raise DataError(f"{where}: corrupted AnnotatedDatum record: {e}") from None
    if not anno.HasField("datum"):
        raise DataError(f"{where}: not an AnnotatedDatum record (it holds no datum; a Datum database is read by "
                        "the Data layer, an AnnotatedData database is written by convert_annoset)")
    image, label = datum_to_array(anno.datum, where)
    rows = [(g.group_label, a.instance_id, a.bbox.xmin, a.bbox.ymin, a.bbox.xmax, a.bbox.ymax, a.bbox.difficult)
            for g in anno.annotation_group for a in g.annotation]
    boxes = numpy.array(rows, numpy.float32).reshape(-1, len(BOX_COLUMNS))
    return image, boxes, label, anno.HasField("type")


def annotated_record(datum, boxes=None, typed=True):
    """A serialized AnnotatedDatum of a Datum message and (k, 7) ``boxes`` (type BBOX when ``typed``)."""
    anno = AnnotatedDatum()
    anno.datum.CopyFrom(datum)
    if typed:
        anno.type = AnnotatedDatum.BBOX
    groups = {}
    for label, instance, xmin, ymin, xmax, ymax, difficult in numpy.asarray(
            no_boxes() if boxes is None else boxes, numpy.float64).tolist():
        if int(label) not in groups:
            groups[int(label)] = anno.annotation_group.add(group_label=int(label))
        a = groups[int(label)].annotation.add(instance_id=int(instance))
        a.bbox.xmin, a.bbox.ymin, a.bbox.xmax, a.bbox.ymax = xmin, ymin, xmax, ymax
        a.bbox.difficult = bool(difficult)
    return anno.SerializeToString()


def read_label_map(path):
    """The LabelMap message of a prototxt label map file (``item { name label display_name }``)."""
    text = read_text(path, "label map")
    label_map = LabelMap()
    try:
        text_format.Parse(text, label_map)
    except text_format.ParseError as e:
        raise DataError(f"{path}:{str(e)}") from None
    return label_map


def name_to_label(label_map, path, check=False):
    """``{name: label}`` of a LabelMap; with ``check`` a repeated name or label is a DataError (the fork's
    ``--check_label``), else the later item wins."""
    names = {}
    labels = set()
    for item in label_map.item:
        if check and (item.name in names or item.label in labels):
            what = f"name '{item.name}'" if item.name in names else f"label {item.label}"
            raise DataError(f"{path}: the label map repeats {what}")
        names[item.name] = item.label
        labels.add(item.label)
    return names


def label_to_name(label_map):
    """``{label: display name (or name)}`` of a LabelMap."""
    return {item.label: item.display_name or item.name for item in label_map.item}


def write_label_map(path, items):
    """Write a label map file from ``items``: (name, label, display_name) triples."""
    label_map = LabelMap()
    for name, label, display in items:
        label_map.item.add(name=name, label=label, display_name=display)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text_format.MessageToString(label_map))


class _Boxes:
    """Rows of one image's boxes, grouped per class the fork's way (instance ids count up per class)."""

    def __init__(self, path, height, width):
        self.path, self.height, self.width, self.rows, self.instances = path, height, width, [], {}

    def add(self, label, xmin, ymin, xmax, ymax, difficult):
        h, w = self.height, self.width
        if min(xmin, xmax) < 0 or max(xmin, xmax) > w or min(ymin, ymax) < 0 or max(ymin, ymax) > h:
            log.warning("%s: bounding box exceeds image boundary.", self.path)
        if xmin > xmax or ymin > ymax:
            log.warning("%s: bounding box irregular.", self.path)
        instance = self.instances.get(label, 0)
        self.instances[label] = instance + 1
        # float arithmetic, as the fork's readers divide
        f = numpy.float32
        self.rows.append([label, instance, f(xmin) / f(w), f(ymin) / f(h), f(xmax) / f(w), f(ymax) / f(h),
                          float(difficult)])

    def array(self):
        return numpy.array(self.rows, numpy.float32).reshape(-1, len(BOX_COLUMNS))


def _image_size(path, declared, height, width):
    """The declared (height, width) of an annotation file, or the image's own when it declares none."""
    if declared is None:
        return height, width
    if declared != (height, width):
        log.warning("%s: inconsistent image %s.", path, "height" if declared[0] != height else "width")
    if 0 in declared:
        raise DataError(f"{path}: no valid image width/height")
    return declared


def _lookup(names, name, path):
    if name not in names:
        raise DataError(f"{path}: unknown name '{name}' (not in the label map)")
    return names[name]


def read_voc_xml(path, height, width, names):
    """(k, 7) boxes of a PASCAL VOC annotation file, for an image of ``height`` x ``width`` pixels."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError) as e:
        raise DataError(f"{path}: cannot read the annotation: {getattr(e, 'strerror', None) or e}") from None
    try:
        declared = (int(root.findtext("size/height")), int(root.findtext("size/width")))
    except (TypeError, ValueError):
        declared = None
    boxes = _Boxes(path, *_image_size(path, declared, height, width))
    for obj in root.findall("object"):
        label, difficult = None, False
        for child in obj:
            if child.tag == "name":
                label = _lookup(names, (child.text or "").strip(), path)
            elif child.tag == "difficult":
                difficult = (child.text or "").strip() == "1"
            elif child.tag == "bndbox":
                if label is None:
                    raise DataError(f"{path}: an object has a bndbox before its name")
                try:
                    corners = [float(child.findtext(k) or 0) for k in ("xmin", "ymin", "xmax", "ymax")]
                except ValueError as e:
                    raise DataError(f"{path}: a bndbox coordinate is not a number: {e}") from None
                boxes.add(label, *corners, difficult)
    return boxes.array()


def read_json_annotation(path, height, width, names):
    """(k, 7) boxes of the fork's JSON annotation file (COCO's boxes of one image)."""
    try:
        with open(path, "r", encoding="utf-8") as f:
            doc = json.load(f)
        image = doc.get("image", {})
        declared = (int(image["height"]), int(image["width"])) if "height" in image and "width" in image else None
        boxes = _Boxes(path, *_image_size(path, declared, height, width))
        for obj in doc.get("annotation", []):
            x, y, w, h = (numpy.float32(v) for v in obj["bbox"])
            boxes.add(_lookup(names, str(obj["category_id"]), path), x, y, x + w, y + h, bool(obj.get("iscrowd", 0)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise DataError(f"{path}: cannot read the annotation: {getattr(e, 'strerror', None) or e!r}") from None
    return boxes.array()


def read_txt_annotation(path, height, width, names=None):
    """(k, 7) boxes of a text annotation file of ``label xmin ymin xmax ymax`` lines (pixels)."""
    boxes = _Boxes(path, height, width)
    try:
        with open(path, "r", encoding="utf-8") as f:
            tokens = f.read().split()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read the annotation: {getattr(e, 'strerror', None) or e}") from None
    for k in range(0, len(tokens) - len(tokens) % 5, 5):
        try:
            label, corners = int(tokens[k]), [float(t) for t in tokens[k + 1:k + 5]]
        except ValueError:
            break  # the fork's stream read stops at the first token that is not a number
        boxes.add(label, *corners, False)
    return boxes.array()


READERS = {"xml": read_voc_xml, "json": read_json_annotation, "txt": read_txt_annotation}


def read_annotation(path, label_type, height, width, names):
    """(k, 7) boxes of annotation file ``path`` of ``label_type`` for an image of ``height`` x ``width``; no boxes
    when the file does not exist (the fork stores the image alone)."""
    if not os.path.exists(path):
        return no_boxes()
    return READERS[label_type](path, height, width, names)


def resize_for_record(image, height=0, width=0, min_dim=0, max_dim=0):
    """An image (C, H, W) resized as the fork's ReadImageToCVMat does before storing it: to ``min_dim`` on its
    shorter side when that is smaller (then no side above ``max_dim``), keeping the aspect ratio; else to
    ``height`` x ``width`` when both are given."""
    import cv2
    hwc = image.transpose(1, 2, 0)
    if min_dim > 0 or max_dim > 0:
        short, long = min(hwc.shape[:2]), max(hwc.shape[:2])
        factor = numpy.float32(min_dim) / short if 0 < min_dim and short < min_dim else numpy.float32(1)
        if max_dim > 0 and int(factor * long) > max_dim:
            factor = numpy.float32(max_dim) / long
        if factor != 1:
            hwc = cv2.resize(hwc, None, fx=float(factor), fy=float(factor))
    elif height > 0 and width > 0:
        hwc = cv2.resize(hwc, (width, height))
    hwc = hwc.reshape(hwc.shape[0], hwc.shape[1], -1)
    return hwc.transpose(2, 0, 1)


def annotated_records(root, entries, anno_type="detection", label_type="xml", names=None, gray=False,
                      encoded=False, encode_type=None, height=0, width=0, min_dim=0, max_dim=0, check_size=False,
                      source="the list", stats=None):
    """Serialized AnnotatedDatum records, keyed as the fork's convert_annoset keys them (``%08d_<image path>``).

    Args:
        entries: ``(image path, annotation path or integer label, line)`` triples, paths relative to ``root``.
        anno_type: ``detection`` (boxes from the annotation files) or ``classification`` (the integer label).
        check_size: stop at the first image whose stored shape differs from the first one's.
        stats: a dict that receives ``images``, ``boxes``, ``unannotated`` (detection images without a file)
            and ``shapes`` (the set of stored shapes).
    """
    stats = {} if stats is None else stats
    stats.update(images=0, boxes=0, unannotated=0, shapes=set())
    changed = bool(height or width or min_dim or max_dim or gray)
    for index, (path, label, line) in enumerate(entries):
        full = os.path.join(root, path)
        try:
            original = decode_image(numpy.fromfile(full, numpy.uint8), not gray, full)
        except OSError:
            original = None
        if original is None:
            raise DataError(f"{source}:{line}: image '{full}': cannot read the image (missing, or not an image)")
        image = resize_for_record(original, height, width, min_dim, max_dim)
        if check_size and stats["shapes"] and image.shape not in stats["shapes"]:
            first = "x".join(map(str, next(iter(stats["shapes"]))))
            raise DataError(f"{source}:{line}: image '{full}': size {'x'.join(map(str, image.shape))} differs from "
                            f"the first image's {first} (--check_size)")
        # the fork guesses --encoded's type with its dot ('.jpg'), which never matches the file's: it re-encodes
        datum = encoded_datum(encoded_bytes(image, full, encode_type, changed or not encode_type)) \
            if encoded or encode_type else array_to_datum(image)
        datum.channels, datum.height, datum.width = image.shape
        datum.encoded = bool(encoded or encode_type)  # set even when false, as the fork's CVMatToDatum sets it
        if anno_type == "classification":
            datum.label = int(label)
            record = annotated_record(datum, typed=False)
        else:
            datum.label = -1  # ReadRichImageToAnnotatedDatum reads the image with label -1
            annotation = os.path.join(root, label)
            boxes = read_annotation(annotation, label_type, original.shape[1], original.shape[2], names)
            stats["unannotated"] += not os.path.exists(annotation)
            stats["boxes"] += len(boxes)
            record = annotated_record(datum, boxes)
        stats["images"] += 1
        stats["shapes"].add(image.shape)
        yield b"%08d_%s" % (index, path.encode()), record


def convert_annoset(root, list_file, db, anno_type="detection", label_type="xml", label_map_file=None,
                    check_label=False, shuffle=False, seed=0, **options):
    """Write the AnnotatedDatum LMDB ``db`` of the images (and annotation files) of ``list_file``: the fork's
    ``convert_annoset``. ``options`` are :func:`annotated_records`'s image options. Returns the stats dict."""
    if anno_type == "detection":
        if not label_map_file:
            raise DataError("detection annotations need a label map file (--label_map_file)")
        names = name_to_label(read_label_map(label_map_file), label_map_file, check_label)
        entries = read_pair_list_file(list_file, "image annotation")
    else:
        from .images import read_list_file
        names, entries = None, read_list_file(list_file)
    if shuffle:
        entries = [entries[i] for i in numpy.random.RandomState(seed).permutation(len(entries))]
    stats = {}
    write_lmdb_atomic(db, annotated_records(root, entries, anno_type, label_type, names, source=list_file,
                                            stats=stats, **options))
    return stats
