"""A synthetic detection set: coloured shapes on cluttered backgrounds, as images, VOC XML and a label map.

``make(root)`` writes, under ``root/data/shapes/`` (the layout of the SSD fork's ``data/VOC0712``):

- ``JPEGImages/NNNNNN.jpg``: 2,000 training and 400 test images (``trainval`` and ``test``) of 112 to 160
  pixels a side, each showing one to three objects of four classes, ``circle``, ``square``, ``triangle`` and
  ``cross``, of random colour, size (20% to 55% of the shorter side) and place, on a background of a random
  colour gradient, noise, lines, arcs and dots in random colours (clutter that belongs to no class); objects
  may overlap a little (at most 20% of the smaller one is covered) and are not clipped by the border;
- ``Annotations/NNNNNN.xml``: PASCAL VOC annotation files (pixel ``bndbox``, ``difficult`` 0);
- ``labelmap_shapes.prototxt``: the label map (label 0 the background, as the fork's ``labelmap_voc``);
- ``trainval.txt``, ``test.txt``: ``image annotation`` lines, as the fork's ``create_list.sh`` makes them;
  ``test_name_size.txt``: ``name height width`` lines for DetectionEvaluate's ``name_size_file``;
- ``shapes_trainval_lmdb``, ``shapes_test_lmdb``: the AnnotatedDatum databases (encoded JPEG), written with
  ``convert_annoset`` as the fork's ``create_data.sh`` writes VOC's.

Everything is drawn from ``numpy.random.default_rng(seed)`` (seed 0 for the training images, 1 for the test
images), so the set is the same on every machine. Writing is idempotent: existing databases are kept.
"""
import math
import os

import numpy

from .annotations import convert_annoset, write_label_map
from .lmdb_io import lmdb_exists

CLASSES = ("circle", "square", "triangle", "cross")
SPLITS = (("trainval", 0), ("test", 1))  # name, seed
COUNTS = (2000, 400)
FOLDER = os.path.join("data", "shapes")
LABEL_MAP = "labelmap_shapes.prototxt"
MAX_OVERLAP = 0.2  # of the smaller box: no object hides another


def _colour(r, low=40):
    """A random BGR colour with at least one bright channel."""
    c = r.integers(0, 256, 3)
    c[r.integers(3)] = r.integers(160, 256)
    return tuple(int(v) for v in numpy.maximum(c, low * (c.max() < low)))


def background(r, height, width):
    """A cluttered background (H, W, 3) uint8: gradient, noise, lines, arcs and dots."""
    import cv2
    top, bottom = numpy.array(_colour(r, 0), float), numpy.array(_colour(r, 0), float)
    t = numpy.linspace(0, 1, height)[:, None, None]
    image = (top * (1 - t) + bottom * t) * r.uniform(0.3, 0.9) + r.normal(0, 12, (height, width, 3))
    image = numpy.clip(image, 0, 255).astype(numpy.uint8)
    for _ in range(r.integers(3, 9)):
        p, q = (int(r.integers(width)), int(r.integers(height))), (int(r.integers(width)), int(r.integers(height)))
        cv2.line(image, p, q, _colour(r), int(r.integers(1, 3)), cv2.LINE_AA)
    for _ in range(r.integers(1, 4)):
        centre = (int(r.integers(width)), int(r.integers(height)))
        axes = (int(r.integers(8, width // 2)), int(r.integers(8, height // 2)))
        start = int(r.integers(360))
        cv2.ellipse(image, centre, axes, 0, start, start + int(r.integers(40, 200)), _colour(r), 1, cv2.LINE_AA)
    for _ in range(r.integers(10, 40)):
        cv2.circle(image, (int(r.integers(width)), int(r.integers(height))), int(r.integers(1, 3)), _colour(r), -1)
    return image


def draw(image, label, box, colour, r):
    """Draw shape ``label`` (an index into CLASSES) filling ``box`` (x0, y0, x1, y1 pixels, inclusive)."""
    import cv2
    x0, y0, x1, y1 = box
    name = CLASSES[label]
    if name == "circle":
        cv2.ellipse(image, ((x0 + x1) // 2, (y0 + y1) // 2), ((x1 - x0) // 2, (y1 - y0) // 2), 0, 0, 360, colour, -1,
                    cv2.LINE_AA)
    elif name == "square":
        cv2.rectangle(image, (x0, y0), (x1, y1), colour, -1)
    elif name == "triangle":
        apex = int(r.integers(x0, x1 + 1))
        points = numpy.array([[apex, y0], [x0, y1], [x1, y1]], numpy.int32)
        cv2.fillPoly(image, [points], colour, cv2.LINE_AA)
    else:
        bar_w, bar_h = max(2, (x1 - x0) // 3), max(2, (y1 - y0) // 3)
        cx, cy = (x0 + x1) // 2, (y0 + y1) // 2
        cv2.rectangle(image, (cx - bar_w // 2, y0), (cx + bar_w // 2, y1), colour, -1)
        cv2.rectangle(image, (x0, cy - bar_h // 2), (x1, cy + bar_h // 2), colour, -1)


def _overlap(a, b):
    """The share of the smaller of two pixel boxes that the other covers."""
    iw = min(a[2], b[2]) - max(a[0], b[0]) + 1
    ih = min(a[3], b[3]) - max(a[1], b[1]) + 1
    if iw <= 0 or ih <= 0:
        return 0.0
    return iw * ih / min((x[2] - x[0] + 1) * (x[3] - x[1] + 1) for x in (a, b))


def scene(r):
    """One image: ``(image (H, W, 3) uint8 BGR, [(label, (x0, y0, x1, y1)), ...])``."""
    height, width = (int(v) for v in r.integers(112, 161, 2))
    image = background(r, height, width)
    objects = []
    for _ in range(int(r.integers(1, 4))):
        for _ in range(20):  # a place that does not hide the objects already drawn
            side = r.uniform(0.2, 0.55) * min(height, width)
            aspect = math.exp(r.uniform(-0.35, 0.35))
            w, h = int(side * aspect), int(side / aspect)
            x0, y0 = int(r.integers(0, width - w)), int(r.integers(0, height - h))
            box = (x0, y0, x0 + w - 1, y0 + h - 1)
            if all(_overlap(box, other) <= MAX_OVERLAP for _, other in objects):
                label = int(r.integers(len(CLASSES)))
                draw(image, label, box, _colour(r), r)
                objects.append((label, box))
                break
    return image, objects


def voc_xml(name, height, width, objects):
    """A PASCAL VOC annotation document of ``objects`` ``(class index, box)`` (named by CLASSES)."""
    lines = ["<annotation>", "  <folder>shapes</folder>", f"  <filename>{name}.jpg</filename>",
             f"  <size><width>{width}</width><height>{height}</height><depth>3</depth></size>"]
    for label, (x0, y0, x1, y1) in objects:
        lines += ["  <object>", f"    <name>{CLASSES[label]}</name>", "    <difficult>0</difficult>",
                  f"    <bndbox><xmin>{x0}</xmin><ymin>{y0}</ymin><xmax>{x1}</xmax><ymax>{y1}</ymax></bndbox>",
                  "  </object>"]
    return "\n".join(lines + ["</annotation>", ""])


def make(root=".", counts=COUNTS):
    """Write the set under ``root/data/shapes`` (see the module docstring; ``counts`` the training and test images)
    and return the two database paths."""
    import cv2
    folder = os.path.join(root, FOLDER)
    for sub in ("JPEGImages", "Annotations"):
        os.makedirs(os.path.join(folder, sub), exist_ok=True)
    label_map = os.path.join(folder, LABEL_MAP)
    write_label_map(label_map, [("none_of_the_above", 0, "background")] +
                    [(name, k + 1, name) for k, name in enumerate(CLASSES)])
    databases = [os.path.join(folder, f"shapes_{split}_lmdb") for split, _ in SPLITS]
    if all(lmdb_exists(db) for db in databases):
        return databases
    first = 0
    for (split, seed), count, db in zip(SPLITS, counts, databases):
        r = numpy.random.default_rng(seed)
        entries, sizes = [], []
        for k in range(first, first + count):
            name = f"{k:06d}"
            image, objects = scene(r)
            cv2.imwrite(os.path.join(folder, "JPEGImages", name + ".jpg"), image, [cv2.IMWRITE_JPEG_QUALITY, 90])
            with open(os.path.join(folder, "Annotations", name + ".xml"), "w", encoding="utf-8") as f:
                f.write(voc_xml(name, image.shape[0], image.shape[1], objects))
            entries.append(f"JPEGImages/{name}.jpg Annotations/{name}.xml")
            sizes.append(f"{name} {image.shape[0]} {image.shape[1]}")
        first += count
        with open(os.path.join(folder, f"{split}.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(entries) + "\n")
        if split == "test":
            with open(os.path.join(folder, "test_name_size.txt"), "w", encoding="utf-8") as f:
                f.write("\n".join(sizes) + "\n")
        if not lmdb_exists(db):
            convert_annoset(folder, os.path.join(folder, f"{split}.txt"), db, label_map_file=label_map,
                            encoded=True, shuffle=split == "trainval")
    return databases
