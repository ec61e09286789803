"""The SSD fork's detection outputs beyond the top: result files (DetectionOutput's ``save_output_param``) for
the official evaluations, and the video of its ``visualize`` with ``save_file`` (:class:`DetectionVideo`).

Detections are collected image by image, in the order of the name size file (the test database's order), and
written when ``num_test_image`` images have been seen, as the fork writes them:

- ``VOC``: one file per class but the background, ``<prefix><class name>.txt``, lines
  ``image score xmin ymin xmax ymax`` in pixels (the PASCAL VOC devkit's comp4 files);
- ``COCO``: ``<prefix>.json``, a list of ``{"image_id", "category_id" (the class name), "bbox": [x, y, w, h],
  "score"}`` (numbers as numbers, as the fork's writer leaves them);
- ``ILSVRC``: ``<prefix>.txt``, lines ``image label score xmin ymin xmax ymax``.

Boxes are mapped back to the original image (``output_boxes``: undoing the test data's ``resize_param``) and
rounded to 2 decimals; the text formats then truncate each of x, y, width and height to an integer, as the fork
does. Files are written whole, through a temporary file, so a run stopped midway leaves the last complete round.
"""
import json
import os
import re

import numpy

from ..errors import ConfigError, DataError
from ..kernels.bbox import clip_bbox
from ..npz import write_atomic
from . import read_text
from .annotations import read_label_map

FORMATS = ("VOC", "COCO", "ILSVRC")
_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?")


def read_names_and_sizes(path):
    """``(names, [(height, width), ...])`` of a name size file (``name height width`` lines)."""
    tokens = read_text(path, "name size file").split()
    try:
        return tokens[0::3][:len(tokens) // 3], [(int(tokens[k + 1]), int(tokens[k + 2]))
                                                  for k in range(0, len(tokens) - 2, 3)]
    except ValueError:
        raise DataError(f"{path}: expected 'name height width' lines") from None


def output_boxes(boxes, size, resize):
    """Normalized boxes (k, 4) in pixels of an image of ``size`` (height, width): the fork's OutputBBox."""
    height, width = size
    if resize is not None and resize.resize_mode == "FIT_LARGE_SIZE_AND_PAD":
        aspect, target = numpy.float32(width) / height, numpy.float32(resize.width) / resize.height
        if aspect > target:
            pad = (resize.height - resize.width / aspect) / 2 / resize.height
            frame = numpy.array([0, pad, 1, 1 - pad], numpy.float32)
        else:
            pad = (resize.width - resize.height * aspect) / 2 / resize.width
            frame = numpy.array([pad, 0, 1 - pad, 1], numpy.float32)
        boxes = (boxes - frame[[0, 1, 0, 1]]) / (frame[[2, 3, 2, 3]] - frame[[0, 1, 0, 1]])
    elif resize is not None and resize.resize_mode == "FIT_SMALL_SIZE" and resize.height_scale and \
            resize.width_scale:
        scaled = boxes * numpy.array([resize.width_scale, resize.height_scale] * 2, numpy.float32)
        return clip_bbox(scaled, height, width)
    return clip_bbox(boxes) * numpy.array([width, height] * 2, numpy.float32)


def _json_value(text):
    """The fork's JSON writer quotes every value, then unquotes those that read as numbers."""
    if _NUMBER.fullmatch(text):
        return float(text) if "." in text else int(text)
    return text


class ResultFiles:
    """Collects one DetectionOutput's detections and writes the result files of each round of
    ``num_test_image`` images.

    A DataError from the constructor (no label map or name size file, one that cannot be read, or fewer
    names than ``num_test_image``) means no files: the layer warns and goes on, as the fork does for a missing
    name (a deploy file keeps its test net's paths and counts).

    Args:
        p: the layer's ``save_output_param`` block (validated).
        num_classes, background: the layer's ``num_classes`` and ``background_label_id``.
        where: the layer, for error messages.
    """

    def __init__(self, p, num_classes, background, where):
        self.p, self.background, self.directory = p, background, p.output_directory
        if p.output_format not in FORMATS:
            raise ConfigError(f"{where}: save_output_param.output_format must be one of "
                                     f"{', '.join(FORMATS)}, got {p.output_format!r}")
        for key in ("label_map_file", "name_size_file"):
            if not getattr(p, key):
                raise DataError(f"save_output_param.{key} is needed to write result files")
        label_map = read_label_map(p.label_map_file)
        self.names_of = {}
        for item in label_map.item:
            if item.label in self.names_of:
                raise ConfigError(f"{p.label_map_file}: the label map repeats label {item.label}")
            self.names_of[item.label] = item.name
        self.classes = [c for c in range(num_classes) if c != background]
        missing = [c for c in self.classes if c not in self.names_of]
        if missing:
            raise ConfigError(f"{p.label_map_file}: no name for label {missing[0]} ({where} has {num_classes} "
                              "classes)")
        self.images, self.sizes = read_names_and_sizes(p.name_size_file)
        self.per_round = len(self.images) if p.num_test_image is None else p.num_test_image
        if not 0 < self.per_round <= len(self.images):
            raise DataError(f"save_output_param.num_test_image {self.per_round} must be between 1 and the "
                            f"{len(self.images)} images of {p.name_size_file}")
        self.resize = p.resize_param if p.given("resize_param") and p.resize_param.resize_mode else None
        os.makedirs(self.directory, exist_ok=True)
        self.count, self.found = 0, []

    def add_image(self, rows):
        """The detections of the next image: rows ``(label, score, xmin, ymin, xmax, ymax)`` (normalized)."""
        name, size = self.images[self.count], self.sizes[self.count]
        if len(rows):
            rows = numpy.asarray(rows, numpy.float32)
            boxes = output_boxes(rows[:, 2:6], size, self.resize)
            for (label, score), box in zip(rows[:, :2].tolist(), boxes.tolist()):
                x, y = round(box[0] * 100) / 100, round(box[1] * 100) / 100
                w, h = round((box[2] - box[0]) * 100) / 100, round((box[3] - box[1]) * 100) / 100
                self.found.append((name, int(label), float(numpy.float32(score)), (x, y, w, h)))
        self.count += 1
        if self.count == self.per_round:
            self.write()
            self.count, self.found = 0, []

    def write(self):
        """Write this round's files (every class's VOC file, empty ones included)."""
        prefix = os.path.join(self.directory, self.p.output_name_prefix)
        if self.p.output_format == "VOC":
            lines = {c: [] for c in self.classes}
            for name, label, score, box in self.found:
                if label in lines:
                    x, y, w, h = (int(v) for v in box)
                    lines[label].append(f"{name} {score:.6g} {x} {y} {x + w} {y + h}\n")
            for c, text in lines.items():
                _write(f"{prefix}{self.names_of[c]}.txt", "".join(text))
        elif self.p.output_format == "COCO":
            records = [{"image_id": _json_value(name), "category_id": _json_value(self.names_of[label]),
                        "bbox": list(box), "score": score} for name, label, score, box in self.found]
            _write(f"{prefix}.json", json.dumps(records, indent=2) + "\n")
        else:
            text = []
            for name, label, score, box in self.found:
                x, y, w, h = (int(v) for v in box)
                text.append(f"{name} {label} {score:.6g} {x} {y} {x + w} {y + h}\n")
            _write(f"{prefix}.txt", "".join(text))


def _write(path, text):
    write_atomic(path, lambda f: f.write(text.encode("utf-8")))


def fork_colors(n):
    """The fork's GetColors: ``n`` (b, g, r)-ordered colours 0..255, hues from OpenCV's RNG(12345) stepped by the
    golden ratio, saturation 0.3, value 0.99 (the same colours as the fork's windows)."""
    state, colors = 12345, []
    for _ in range(n):
        state = (state & 0xFFFFFFFF) * 4164903690 + (state >> 32)  # cv::RNG::next, multiply with carry
        uniform = numpy.float32(numpy.float32(state & 0xFFFFFFFF) * numpy.float32(2.3283064365386962890625e-10))
        h = float(numpy.fmod(numpy.float32(uniform + numpy.float32(0.618033988749895)), numpy.float32(1.0)))
        i, f = int(h * 6), h * 6 - int(h * 6)
        s, v = 0.3, 0.99
        p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
        r, g, b = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)][i] if i < 6 else (1, 1, 1)
        colors.append((r * 255, g * 255, b * 255))  # the fork hands cv::Scalar(r, g, b) to BGR drawing as is
    return colors


class DetectionVideo:
    """The SSD fork's ``visualize`` with ``save_file``: each image with its detections above ``threshold`` drawn
    (a box and ``name: score`` in the class's colour, the frames per second in the corner), appended to the video
    ``path`` (DIVX, 30 frames per second, the first image's size), as the fork writes it. There is no window
    (the fork's imshow): the file is the output.

    Args:
        path: the video file (``save_file``).
        threshold: ``visualize_threshold``.
        names: ``{label: display name}`` (the label map's; "Unknown" for the others).
        num_classes: the number of colours.
    """

    def __init__(self, path, threshold, names, num_classes):
        self.path, self.threshold, self.names = path, threshold, names
        self.colors = fork_colors(max(num_classes, max(names, default=0) + 1))
        self.writer, self.frames, self.last = None, 0, None

    def add(self, images, rows):
        """Draw detection ``rows`` (D, 7: image, label, score, xmin, ymin, xmax, ymax, normalized) on ``images``
        (a list of (H, W, 3) uint8, drawn in place) and append them to the video."""
        import time

        import cv2

        now = time.perf_counter()
        fps = len(images) / (now - self.last) if self.last is not None and now > self.last else 0.0
        self.last = now
        face, scale, thickness = cv2.FONT_HERSHEY_SIMPLEX, 1, 2
        for i, image in enumerate(images):
            height, width = image.shape[:2]
            text = f"FPS: {fps:.2f}"
            (tw, th), base = cv2.getTextSize(text, face, scale, thickness)
            cv2.rectangle(image, (0, 0), (tw, th + base), (255, 255, 255), cv2.FILLED)
            cv2.putText(image, text, (0, int(th + base / 2)), face, scale, (0, 0, 0), thickness, 8)
            for _, label, score, *box in rows[(rows[:, 0] == i) & (rows[:, 2] >= self.threshold)].tolist():
                label, color = int(label), self.colors[int(label)]
                x0, y0, x1, y1 = (int(v * s) for v, s in zip(box, (width, height, width, height)))
                cv2.rectangle(image, (x0, y0), (x1, y1), color, 4)
                caption = f"{self.names.get(label, 'Unknown')}: {score:.2f}"
                (tw, th), base = cv2.getTextSize(caption, face, scale, thickness)
                cv2.rectangle(image, (x0, y1), (x0 + tw, y1 - th - base), color, cv2.FILLED)
                cv2.putText(image, caption, (x0, y1 - base), face, scale, (0, 0, 0), thickness, 8)
            if self.writer is None:
                self.writer = cv2.VideoWriter(self.path, cv2.VideoWriter_fourcc(*"DIVX"), 30, (width, height), True)
                if not self.writer.isOpened():
                    raise DataError(f"{self.path}: OpenCV cannot write a video here")
            self.writer.write(image if image.shape[2] == 3 else cv2.cvtColor(image, cv2.COLOR_GRAY2BGR))
            self.frames += 1

    def close(self):
        """Finish the video file (its index): at the end of the run, or when the layer goes."""
        if self.writer is not None:
            self.writer.release()
            self.writer = None
