"""Data layers: ``Data`` (an LMDB database) and ``ImageData`` (a list file of images), with Caffe's transform.

Both produce, each forward, a batch ``data`` (N, C, h, w) and optionally ``label`` (N,). Which records,
crops and mirrors make up each batch is decided by layerforge.data.batches.BatchStream from the seed and the
read position; decode worker processes (layerforge.data.decode_pool) read, decode and crop the records of
``prefetch`` batches ahead, straight into shared memory; the DeviceFeed finishes each batch (mean, scale)
on the layer's device. ``get_state()`` / ``set_state()`` save and restore the read position and shuffle
seed so a resumed run reads exactly the batches an uninterrupted run would, whatever the number of workers.
"""
import itertools
import logging
import weakref

import numpy

from .. import rng
from ..data import mnist
from ..data.batches import BatchStream
from ..data.decode_pool import DecodePool, decode_workers
from ..data.detection_transform import ANNOTATED_TRANSFORM, AnnotatedBatches, check_params, new_size
from ..data.device_feed import DeviceFeed
from ..data.images import ImageList
from ..data.input_stats import InputStats
from ..data.lmdb_io import LMDBReader, lmdb_exists
from ..data.transform import TRANSFORM, DataTransformer, resolve_path
from ..errors import DataError
from ..schema import REQUIRED
from .base import Field, Layer, register_layer

log = logging.getLogger("layerforge")
NO_BOXES = numpy.zeros((0, 7), numpy.float32)
COMMON = {
    "rand_skip": Field("int", 0, min=0, doc="start at a random record in [0, rand_skip) (decorrelates workers)"),
    "prefetch": Field("int", 4, min=0, doc="batches the decode workers prepare ahead; 0: made during forward"),
    "decode_workers": Field("int", 0, min=0, doc="processes that read, decode and crop records (0: one per core, "
                                                 "the cores divided among a node's processes; "
                                                 "$LAYERFORGE_DECODE_WORKERS overrides)"),
    "rank": Field("int", 0, min=0, doc="read shard `rank` of `world_size` (records rank, rank + world_size, ...)"),
    "world_size": Field("int", 1, min=1, doc="number of disjoint shards the source is split into"),
}


# the SSD fork's DataTransformer applies these to every image a Data or ImageData layer decodes (its cv::Mat
# Transform): resized, then noise, then a crop of crop_h x crop_w
FORK_KEYS = ("crop_h", "crop_w", "resize_param", "noise_param")
FORK_TRANSFORM = dict(TRANSFORM, **{key: ANNOTATED_TRANSFORM[key] for key in FORK_KEYS})


def uses_fork_transform(t):
    """Whether the transform block ``t`` asks for the SSD fork's resize, noise or crop_h / crop_w."""
    return t.given("resize_param") or t.given("noise_param") or bool(getattr(t, "crop_h", 0) or
                                                                     getattr(t, "crop_w", 0))


def check_fork_transform(layer_class, lp):
    """One-line errors for the SSD fork's transform keys, in a layer (of ``layer_class``, whose parameter block
    ``block`` has the batch_size) whose transform block has them."""
    p = getattr(lp, layer_class.block)
    if layer_class.param_blocks.get("transform") is FORK_TRANSFORM and uses_fork_transform(lp.transform):
        t = lp.transform
        check_params(t, lp.error)
        if t.given("resize_param") and t.resize_param.resize_mode == "FIT_SMALL_SIZE" and p.batch_size != 1:
            raise lp.error("resize_mode FIT_SMALL_SIZE gives every image its own shape: it needs batch_size 1",
                           f"{layer_class.block}.batch_size")
        if (t.crop_h > 0) != (t.crop_w > 0):
            raise lp.error("give both crop_h and crop_w, or neither", "transform.crop_h")


# the keys ImageData and DenseImageData share: where the list's images are and how they are decoded
IMAGE_LIST = {
    "root_folder": Field("str", "", doc="prefix of every path of the list"),
    "shuffle": Field("bool", False, doc="reshuffle the list every epoch"),
    "new_height": Field("int", 0, min=0, doc="resize to this height (with new_width)"),
    "new_width": Field("int", 0, min=0, doc="resize to this width (with new_height)"),
    "is_color": Field("bool", True, doc="decode images as 3-channel BGR (false: 1-channel grey)"),
}


def close_feeds(feeds):
    """Close and remove each DeviceFeed of the list ``feeds`` (a layer's; also its finalizer, which holds the list,
    not the layer)."""
    while feeds:
        feeds.pop().close()


def input_stats(net):
    """The :class:`~layerforge.data.input_stats.InputStats` of ``net``'s data layers, summed."""
    total = InputStats()
    for layer in net.layers:
        if getattr(layer, "input_stats", None) is not None:
            total = total + layer.input_stats
    return total


def reset_input_stats(net):
    """Start a new window of input statistics in every data layer of ``net``."""
    for layer in net.layers:
        if getattr(layer, "input_stats", None) is not None:
            layer.input_stats.reset()


def input_display(net):
    """The input's line of the solver's train display, ``fn(seconds per iteration, iterations) -> line``: each
    display, the input statistics of ``net`` since the previous one as one line, and a warning when the loop was
    input-bound (None, and a new window, for a display after no iteration); None for a net without image data layers.
    A replica of a split batch (``net.split``) reads its shard: the line gives the rate of the whole batch, the
    replicas' together, as the display's img/s does."""
    if not any(getattr(layer, "input_stats", None) is not None for layer in net.layers):
        return None

    def line(seconds_per_iteration, iterations):
        stats = input_stats(net)
        reset_input_stats(net)
        if not iterations:
            return None
        if stats.warning():
            log.warning("%s", stats.warning())
        return stats.summary(replicas=(net.split or (0, 1))[1])
    return line


class BaseData(Layer):
    """Shared machinery: a record source, a stream that plans each batch, decode workers that fill it, and a
    DeviceFeed that finishes it on the layer's device.

    ``self.stream`` provides ``plan(position)``, ``fill(arrays, item)``, ``finish(xp, arrays, extra, outs)``,
    ``layout()`` and ``describe(item)`` (BatchStream, WindowSampler). ``self.input_stats`` counts the batches
    handed out, the time forwards waited for them and the workers' time (layerforge.data.input_stats).
    """

    num_bottom = (0, 0)
    num_top = (1, 2)
    backward_reads = ()
    has_backward = False
    block = None
    default_shuffle = False

    @classmethod
    def validate_params(cls, lp):
        p = getattr(lp, cls.block)
        if p.rank >= p.world_size:
            raise lp.error(f"rank {p.rank} must be less than world_size {p.world_size}", f"{cls.block}.rank")
        check_fork_transform(cls, lp)

    stream_class = BatchStream  # plans and fills the batches (layerforge.data.batches)

    def cropped_shape(self, p, shape):
        """The (C, H, W) of a record of ``shape`` as the transform receives it (a layer that crops first says so)."""
        return shape

    def open_source(self, p):
        """The record source: ``len()``, ``read(index)``, ``name_of(index)``; ``reopen()`` if a forked decode
        worker must open it afresh."""
        raise NotImplementedError

    def layer_setup(self, bottom, top):
        p = getattr(self.layer_param, self.block)
        self.records = self.open_source(p)
        self.batch_size = p.batch_size
        try:  # the first record gives the shape and kind of values of every batch
            first, _ = self.records.read(0)
        except DataError as e:
            raise DataError(f"layer '{self.name}' ({self.type}): {e}") from None
        self.transformer = DataTransformer(self.layer_param.transform, self.phase, self.dtype,
                                           source=f"layer '{self.name}' ({self.type})")
        shuffle = self.default_shuffle if p.shuffle is None else p.shuffle
        if uses_fork_transform(self.layer_param.transform):
            self.stream = self.fork_stream(p.batch_size, first, shuffle, p.rank, p.world_size)
        else:
            self.top_shape = (p.batch_size,) + self.transformer.output_shape(self.cropped_shape(p, first.shape))
            self.stream = self.stream_class(self.records.read, len(self.records), p.batch_size, self.transformer,
                                            shuffle, rng.get_rng().integers(2 ** 63), p.rank, p.world_size,
                                            first.shape, self.records.name_of, first.dtype)
        self.setup_feed(p, getattr(self.records, "reopen", None))

    def fork_stream(self, batch_size, first, shuffle, rank=0, world_size=1):
        """The stream of a layer whose transform has the SSD fork's keys: each image resized, noised, cropped and
        mirrored by a decode worker as the fork's DataTransformer does for a decoded image, with a random stream
        of its own (AnnotatedData's image path, without boxes)."""
        t, where = self.layer_param.transform, f"layer '{self.name}' ({self.type})"
        if first.dtype != numpy.uint8:
            raise DataError(f"{where}: transform.resize_param, noise_param and crop_h / crop_w work on 8-bit "
                            f"images; the records hold {first.dtype} values")
        c, h, w = first.shape
        if t.given("resize_param"):
            h, w = new_size(t.resize_param, h, w)
        self.transformer.output_shape((c, h, w))  # the mean and a crop_size against the resized images
        crop = (t.crop_size,) * 2 if t.crop_size else (t.crop_h, t.crop_w)
        cropped = crop[0] > 0 and crop[1] > 0
        if cropped and (crop[0] > h or crop[1] > w):
            raise DataError(f"{where}: the crop {crop[0]}x{crop[1]} is larger than the images ({h}x{w}"
                            f"{' after resizing' if t.given('resize_param') else ''})")
        if cropped:
            h, w = crop
        fixed = cropped or (t.given("resize_param") and t.resize_param.resize_mode != "FIT_SMALL_SIZE")
        self.top_shape = (batch_size, c, h, w)
        read = self.records.read

        def read_image(index):  # a record as AnnotatedBatches reads one: no boxes, its label
            image, label = read(index)
            return image, NO_BOXES, label, False

        return AnnotatedBatches(read_image, len(self.records), batch_size, self.transformer, shuffle,
                                rng.get_rng().integers(2 ** 63), rank, world_size, self.records.name_of, t,
                                [], self.phase, False, False, (c, h, w) if fixed else None)

    def setup_feed(self, p, worker_setup=None):
        """Start ``self.stream`` at a random record below ``rand_skip`` (where block ``p`` has it) and keep the
        decode settings of ``p``; the workers start at the first forward."""
        if getattr(p, "rand_skip", 0):
            self.stream.position = int(rng.get_rng().integers(p.rand_skip))
        self.prefetch, self.workers = p.prefetch, decode_workers(p.decode_workers)
        self.worker_setup = worker_setup
        self.input_stats = InputStats(self.workers)
        self._feeds = []  # at most one DeviceFeed, over the workers' batches from the read position
        weakref.finalize(self, close_feeds, self._feeds)  # holds the list, not self: a dropped layer stops its workers

    label_shape = None  # the label top's shape where it is no (N,) vector of labels

    def reshape(self, bottom, top):
        top[0].reshape(self.top_shape)
        if len(top) > 1:
            top[1].reshape(self.label_shape or self.batch_size)

    def record_of(self, item):
        """The name of the record at ``item`` of the batch the last forward produced (its key, or file and line)."""
        index = self.stream.indices(self.batch_position, self.batch_size)[item]
        return self.stream.name_of(index)

    def forward(self, bottom, top):
        # a stream whose records return values (boxes, images of their own shape) gets them with its batch and
        # fills the top Blobs, which it reshapes; the others fill the tops' arrays
        returns = getattr(self.stream, "returns", False)
        if not self._feeds:
            self.decode_pool = DecodePool(self.stream.fill, self.stream.layout(), max(1, self.prefetch), self.workers,
                                          f"layer '{self.name}' ({self.type})", self.stream.describe,
                                          self.worker_setup, self.input_stats, self.name, returns=returns)
            positions = itertools.count(self.stream.position, self.batch_size)
            batches = self.decode_pool.batches(self.stream.plan, positions)
            self._feeds.append(DeviceFeed(self.xp, batches, self.stream.finish))
        self.batch_position = self.stream.position
        try:
            self._feeds[0].next_into(top if returns else [t.data for t in top])
        except BaseException:
            self.close()  # the next forward starts again at this batch
            raise
        self.stream.position += self.batch_size
        self.top_shape = top[0].shape  # a stream that reshapes its tops: this batch's shape until the next

    def backward(self, top, propagate_down, bottom):
        pass

    def get_state(self):
        """The read position and shuffle seed: a JSON-able dict for snapshots."""
        return dict(self.stream.get_state(), type=self.type)

    def set_state(self, state):
        """Resume reading where ``get_state()`` was taken (batches already prepared are dropped)."""
        self.close()
        self.stream.set_state(state)

    def close(self):
        """Stop the decode workers and drop a batch staged on the device (both restart on the next forward)."""
        close_feeds(self._feeds)


@register_layer("Data")
class Data(BaseData):
    """Reads an LMDB database of Caffe Datum records, or of layerforge's LFR1 records (docs/data.md).

    The format is told by the database's first record: Datum (raw uint8 ``data``, ``float_data``, or
    an ``encoded`` PNG/JPEG decoded by OpenCV with the file's own channels), as Caffe's
    convert_imageset and ours write it, or LFR1 (layerforge/data/lmdb_io.py). Record problems (values
    that do not fill the shape, an undecodable image, a shape unlike the first record's) name the key.

    Tops: ``data`` (N, C, h, w) in the layer's dtype, transformed; optional ``label`` (N,).
    ``shuffle`` (default: true in TRAIN, false in TEST) draws a new record order each epoch. The
    sources ``data/mnist/mnist_{train,test}_lmdb`` are created from the bundled MNIST digits when
    they do not exist.
    """

    block = "data"
    param_blocks = {
        "data": dict(COMMON, **{
            "source": Field("str", REQUIRED, doc="path of the LMDB directory"),
            "batch_size": Field("int", REQUIRED, min=1, doc="records per batch"),
            "backend": Field("enum", "LMDB", choices=("LMDB",), doc="database kind (only LMDB)"),
            "shuffle": Field("bool", None, doc="reshuffle every epoch (default: true in TRAIN, false in TEST)"),
        }),
        "transform": FORK_TRANSFORM,
    }

    @property
    def default_shuffle(self):
        return self.phase == "TRAIN"

    def open_source(self, p):
        path = resolve_path(p.source)
        if not lmdb_exists(path):
            path = mnist.default_source(p.source) or path
        try:
            return LMDBReader(path)
        except DataError as e:
            raise DataError(f"layer '{self.name}' (Data): data.source '{p.source}': {e}") from None


@register_layer("ImageData")
class ImageData(BaseData):
    """Reads the images of a list file of ``path label`` lines (paths relative to ``root_folder``).

    Images are decoded with OpenCV (BGR, or grey with ``is_color: false``) and resized to
    new_height x new_width when both are set; all must then have one size. Tops as for ``Data``.
    """

    block = "image_data"
    param_blocks = {
        "image_data": dict(COMMON, **{
            "source": Field("str", REQUIRED, doc="the list file: one 'path label' per line"),
            "batch_size": Field("int", 1, min=1, doc="images per batch"),
        }, **IMAGE_LIST),
        "transform": FORK_TRANSFORM,
    }

    @classmethod
    def validate_params(cls, lp):
        super().validate_params(lp)
        cls.both_or_neither(lp, ("new_height", "new_width"))

    @classmethod
    def both_or_neither(cls, lp, *pairs):
        """ConfigError unless each pair of keys of the block is set both (> 0) or neither."""
        p = getattr(lp, cls.block)
        for a, b in pairs:
            if (getattr(p, a) > 0) != (getattr(p, b) > 0):
                raise lp.error(f"give both {a} and {b}, or neither", f"{cls.block}.{a}")

    def open_source(self, p):
        return ImageList(resolve_path(p.source), p.root_folder, p.new_height, p.new_width, p.is_color)
