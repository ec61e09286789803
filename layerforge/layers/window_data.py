"""WindowData: object / background windows cut from images and warped to a square (Caffe's R-CNN data layer)."""
import math
import os

import numpy

from .. import rng
from ..data import read_text
from ..data.images import load_image
from ..data.transform import TRANSFORM, load_mean, resolve_path
from ..errors import DataError
from ..kernels.threadpool import host_work, parallel_for
from ..schema import REQUIRED
from .base import Field, register_layer
from .data import COMMON, BaseData


def _round(v):
    """C's round(): halves away from zero (Python's round() takes halves to even)."""
    return int(math.copysign(math.floor(abs(v) + 0.5), v))


def read_window_file(source, root_folder=""):
    """``(images, windows)`` from Caffe's window file.

    The file repeats: ``# image_index``, the image path, channels, height, width, the number of windows, and
    that many ``class overlap x1 y1 x2 y2`` lines (pixel coordinates, inclusive). ``images`` is a list of
    ``(path, channels)``; ``windows`` an array (n, 7) of ``image, class, overlap, x1, y1, x2, y2`` where
    ``image`` indexes ``images`` (the order of the file, as Caffe's image_index is).
    """
    tokens = [(tok, number) for number, line in enumerate(read_text(source, "window file").splitlines(), 1)
              for tok in line.split()]
    if not tokens:
        raise DataError(f"{source}: the window file is empty")
    pos, images, windows = 0, [], []

    def take(count, kinds):
        nonlocal pos
        if pos + count > len(tokens):
            raise DataError(f"{source}:{tokens[-1][1]}: the window file ends in the middle of an image entry")
        items = tokens[pos:pos + count]
        pos += count
        try:
            return [kind(tok) for kind, (tok, _) in zip(kinds, items)]
        except ValueError:
            raise DataError(f"{source}:{items[0][1]}: expected {count} numbers, got "
                            f"{' '.join(t for t, _ in items)!r}") from None

    while pos < len(tokens):
        tag, number = tokens[pos]
        if tag != "#":
            raise DataError(f"{source}:{number}: expected '# image_index', got {tag!r}")
        pos += 1
        take(1, [int])
        (path,) = take(1, [str])
        channels, _, _, count = take(4, [int] * 4)
        if channels not in (1, 3):
            raise DataError(f"{source}:{number}: image '{path}' has {channels} channels; 1 or 3 are supported")
        images.append((os.path.join(root_folder, path) if root_folder else path, channels))
        for _ in range(count):
            label, overlap, x1, y1, x2, y2 = take(6, [int, float, int, int, int, int])
            windows.append((len(images) - 1, label, overlap, x1, y1, x2, y2))
    return images, numpy.array(windows, dtype=numpy.float64).reshape(-1, 7)


class WindowSampler:
    """Batches of warped windows, planned from the seed and the position alone (see BaseData for the steps).

    Each batch holds ``N - int(N fg_fraction)`` background windows, then ``int(N fg_fraction)`` foreground
    ones, each drawn uniformly from its set (as Caffe orders them). A decode worker warps a window's pixels
    (uint8) into the batch and records the rectangle they cover; :meth:`finish` subtracts the mean, scales, and
    leaves the rest 0, on the layer's device. It holds no reference to the layer, so workers running it do not
    keep a dropped layer alive.
    """

    def __init__(self, p, t, fg, bg, images, mean, dtype, train, where, seed):
        self.p, self.t, self.fg, self.bg, self.images, self.mean = p, t, fg, bg, images, mean
        self.dtype, self.mirror, self.where = numpy.dtype(dtype), t.mirror and train, where
        self.seed, self.position = int(seed), 0
        self.cache = [self.load(i) for i in range(len(images))] if p.cache_images else None
        self._means = {}  # the mean as an array of each array module finish() ran with

    def load(self, i):
        path, channels = self.images[i]
        image = load_image(path, is_color=channels == 3)
        if image is None:
            raise DataError(f"{self.where}: image '{path}': cannot read it (missing, or not an image)")
        return image

    def layout(self):
        """A batch's host arrays: warped windows (N, C, S, S) uint8, labels (N,), and per window the rectangle
        ``(top, left, height, width)`` its pixels cover."""
        n, crop = self.p.batch_size, self.t.crop_size
        return [((n, self.images[0][1], crop, crop), numpy.uint8), ((n,), numpy.float64), ((n, 4), numpy.int64)]

    def plan(self, position):
        """``(items, None)``: per window i of the batch at ``position``, ``(i, window row, mirror)``."""
        r = numpy.random.default_rng([self.seed, position])
        n = self.p.batch_size
        num_fg = int(n * self.p.fg_fraction)
        picks = [self.bg[r.integers(len(self.bg), size=n - num_fg)] if n > num_fg else self.bg[:0],
                 self.fg[r.integers(len(self.fg), size=num_fg)] if num_fg else self.fg[:0]]
        windows = numpy.concatenate(picks)
        mirror = r.integers(0, 2, size=n).astype(bool) & self.mirror
        return list(zip(range(n), map(tuple, windows.tolist()), mirror.tolist())), None

    def describe(self, item):
        window = item[1]
        return f"{self.where}: image '{self.images[int(window[0])][0]}', window {tuple(int(v) for v in window[3:])}"

    def fill(self, arrays, item):
        """Warp window ``item`` of :meth:`plan` into the batch ``arrays`` (:meth:`layout`)."""
        i, window, mirror = item
        image = self.cache[int(window[0])] if self.cache else self.load(int(window[0]))
        arrays[2][i] = self.warp_into(arrays[0][i], image, window, mirror)
        arrays[1][i] = window[1]

    def warp_into(self, out, image, window, mirror):
        """Warp ``window`` (image, class, overlap, x1, y1, x2, y2) of ``image`` (C, H, W) into ``out`` (C, S, S),
        zero outside the part inside the image; returns that part's rectangle (top, left, height, width)."""
        import cv2
        crop = self.t.crop_size
        _, height, width = image.shape
        x1, y1, x2, y2 = (int(v) for v in window[3:])
        out_h = out_w = crop
        pad_h = pad_w = 0
        pad, square = self.p.context_pad, self.p.crop_mode == "SQUARE"
        if pad > 0 or square:
            context_scale = crop / (crop - 2 * pad)
            half_h, half_w = (y2 - y1 + 1) / 2, (x2 - x1 + 1) / 2
            cx, cy = x1 + half_w, y1 + half_h
            if square:
                half_h = half_w = max(half_h, half_w)
            x1, x2 = _round(cx - half_w * context_scale), _round(cx + half_w * context_scale)
            y1, y2 = _round(cy - half_h * context_scale), _round(cy + half_h * context_scale)
            full_h, full_w = y2 - y1 + 1, x2 - x1 + 1
            pad_x1, pad_y1 = max(0, -x1), max(0, -y1)
            pad_x2, pad_y2 = max(0, x2 - width + 1), max(0, y2 - height + 1)
            x1, x2, y1, y2 = x1 + pad_x1, x2 - pad_x2, y1 + pad_y1, y2 - pad_y2
            scale_x, scale_y = crop / full_w, crop / full_h
            out_w, out_h = _round((x2 - x1 + 1) * scale_x), _round((y2 - y1 + 1) * scale_y)
            pad_h = _round(pad_y1 * scale_y)
            pad_w = _round((pad_x2 if mirror else pad_x1) * scale_x)  # the padding is mirrored too
            out_h, out_w = min(out_h, crop - pad_h), min(out_w, crop - pad_w)
        if not (0 <= x1 <= x2 < width and 0 <= y1 <= y2 < height):
            raise DataError(f"{self.where}: window ({x1}, {y1}, {x2}, {y2}) lies outside its "
                            f"{width}x{height} image "
                            f"'{self.images[int(window[0])][0]}'")
        region = cv2.resize(numpy.ascontiguousarray(image[:, y1:y2 + 1, x1:x2 + 1].transpose(1, 2, 0)),
                            (out_w, out_h), interpolation=cv2.INTER_LINEAR).reshape(out_h, out_w, -1)
        region = region.transpose(2, 0, 1)
        out[...] = 0
        out[:, pad_h:pad_h + out_h, pad_w:pad_w + out_w] = region[:, :, ::-1] if mirror else region
        return pad_h, pad_w, out_h, out_w

    def finish(self, xp, arrays, extra, outs):
        """The tops from a filled batch, on ``xp``: ``(pixel - mean) * scale`` inside each window's rectangle,
        0 outside."""
        windows, labels, rects = arrays
        out, crop = outs[0], self.t.crop_size
        mean, scale = self._mean_on(xp), self.dtype.type(self.t.scale)
        side = xp.arange(crop)

        def body(lo, hi):
            y, top, left, h, w = out[lo:hi], *(rects[lo:hi, k:k + 1] for k in range(4))
            y[...] = windows[lo:hi]
            if mean is not None:
                y -= mean
            y *= scale
            rows, cols = (side >= top) & (side < top + h), (side >= left) & (side < left + w)
            xp.copyto(y, 0, where=~(rows[:, None, :, None] & cols[:, None, None, :]))

        parallel_for(len(out), body, host_work(out))
        if len(outs) > 1:
            outs[1][...] = labels

    def _mean_on(self, xp):
        if self.mean is not None and xp not in self._means:
            self._means[xp] = xp.asarray(numpy.ascontiguousarray(self.mean))  # a mean_value is a broadcast view
        return self._means.get(xp)

    def get_state(self):
        return {"seed": self.seed, "position": int(self.position)}

    def set_state(self, state):
        self.seed, self.position = int(state["seed"]), int(state["position"])


@register_layer("WindowData")
class WindowData(BaseData):
    """Samples foreground and background windows of images and warps each to crop_size x crop_size.

    The window file lists images and their windows (see read_window_file). A window with overlap >=
    fg_threshold is foreground (its class, > 0, is its label); one with overlap < bg_threshold is background
    (label 0); others are unused. A batch (N, C, S, S), S = transform.crop_size, holds N - int(N
    fg_fraction) background then int(N fg_fraction) foreground windows drawn at random. Each window
    (x1, y1, x2, y2) is, in ``square`` mode, first grown to the square of its longer side; with
    context_pad p it is grown about its centre by S / (S - 2p), so that p pixels of context surround it
    after warping. The part inside the image is resized (OpenCV, bilinear) to its share of S x S and placed
    where it falls; the rest stays 0. Written pixels are ``(pixel - mean) * scale`` (transform.mean_value
    per channel, or transform.mean_file's centre S x S). In TRAIN with ``mirror`` a window is flipped with
    probability 1/2 (Caffe also flips in TEST). Tops: ``data`` and ``label`` (N,).
    """

    block = "window_data"
    param_blocks = {
        "window_data": {
            "source": Field("str", REQUIRED, doc="the window file"),
            "batch_size": Field("int", REQUIRED, min=1, doc="windows per batch"),
            "fg_threshold": Field("float", 0.5, doc="overlap from which a window is foreground"),
            "bg_threshold": Field("float", 0.5, doc="overlap below which a window is background"),
            "fg_fraction": Field("float", 0.25, min=0, max=1, doc="fraction of each batch that is foreground"),
            "context_pad": Field("int", 0, min=0, doc="pixels of context around each warped window"),
            "crop_mode": Field("enum", "WARP", choices=("WARP", "SQUARE"),
                               doc="warp: the window as it is; square: the square around it"),
            "cache_images": Field("bool", False, doc="decode every image once, at setup, and keep them"),
            "root_folder": Field("str", "", doc="prefix of every image path"),
            "prefetch": COMMON["prefetch"],
            "decode_workers": COMMON["decode_workers"],
        },
        "transform": TRANSFORM,
    }

    @classmethod
    def validate_params(cls, lp):
        crop = lp.transform.crop_size
        if crop <= 0:
            raise lp.error("WindowData needs transform.crop_size (the side windows are warped to)",
                           "transform.crop_size")
        if 2 * lp.window_data.context_pad >= crop:
            raise lp.error(f"context_pad {lp.window_data.context_pad} leaves no room in crop_size {crop}",
                           "window_data.context_pad")

    def layer_setup(self, bottom, top):
        self.p, self.p_transform = self.layer_param.window_data, self.layer_param.transform
        where = f"layer '{self.name}' (WindowData)"
        try:
            images, windows = read_window_file(resolve_path(self.p.source), self.p.root_folder)
            fg = windows[windows[:, 2] >= self.p.fg_threshold]
            bg = windows[(windows[:, 2] < self.p.bg_threshold) & (windows[:, 2] < self.p.fg_threshold)]
            bg[:, 1:3] = 0
            if (fg[:, 1] <= 0).any():
                raise DataError(f"a foreground window has class {int(fg[fg[:, 1] <= 0][0, 1])}; classes of "
                                "objects must be > 0")
            self.batch_size = self.p.batch_size
            num_fg = int(self.batch_size * self.p.fg_fraction)
            for count, found, kind in ((num_fg, fg, "foreground"), (self.batch_size - num_fg, bg, "background")):
                if count and not len(found):
                    raise DataError(f"no {kind} windows, and each batch needs {count}")
            channels = images[0][1]
            if any(c != channels for _, c in images):
                raise DataError("all images must have the same number of channels")
            self.mean = self.window_mean(channels)
        except DataError as e:
            raise DataError(f"{where}: window_data.source '{self.p.source}': {e}") from None
        self.stream = WindowSampler(self.p, self.p_transform, fg, bg, images, self.mean, self.dtype,
                                    self.phase == "TRAIN", where, rng.get_rng().integers(2 ** 63))
        crop = self.p_transform.crop_size
        self.top_shape = (self.batch_size, channels, crop, crop)
        self.setup_feed(self.p)

    def window_mean(self, channels):
        """The (C, S, S) mean of a warped window, or None."""
        crop, t = self.p_transform.crop_size, self.p_transform
        if t.mean_file and t.mean_value:
            raise DataError("give transform.mean_file or transform.mean_value, not both")
        if t.mean_file:
            mean = load_mean(t.mean_file)
            off = (mean.shape[2] - crop) // 2  # Caffe centres by the width on both axes
            if mean.shape[0] != channels or off < 0 or off + crop > mean.shape[1]:
                raise DataError(f"mean_file {t.mean_file} of shape {mean.shape} does not fit {channels}-channel "
                                f"{crop}x{crop} windows")
            return mean[:, off:off + crop, off:off + crop].astype(self.dtype)
        if t.mean_value:
            if len(t.mean_value) not in (1, channels):
                raise DataError(f"transform.mean_value has {len(t.mean_value)} values for {channels} channels")
            return numpy.broadcast_to(numpy.asarray(t.mean_value, self.dtype).reshape(-1, 1, 1), (channels, crop, crop))
        return None
