"""SyntheticData: labelled images that a net can learn, made up as it runs (the zoo nets' default data)."""
import numpy

from .. import rng
from ..schema import REQUIRED
from .base import Field, Layer, register_layer


@register_layer("SyntheticData")
class SyntheticData(Layer):
    """Labelled images a net can learn: each class a fixed random pattern, each image its class's pattern plus noise.

    Tops ``data`` (N, C, H, W) and ``label`` (N,). A classifier's loss falls as it learns the patterns, unlike
    on DummyData's random images and labels, where there is nothing to learn.

    Class ``k``'s pattern ``P_k`` (C, H, W) holds ``grid`` x ``grid`` blocks per channel, each one standard
    normal value drawn from ``(seed, k)``: coarse blobs, which a randomly initialised net tells apart even
    after global pooling (patterns of independent pixels all look alike there). Each forward writes

        data[n] = scale * (P_label[n] + noise * z[n]),   z standard normal,

    with N = ``batch_size`` labels in which every class appears N // classes or N // classes + 1 times
    (balanced batches: the classes drawn for the extra places and the order are random). Labels and noise
    come from the process random stream (``layerforge.rng``, so ``random_seed`` repeats a run); on a GPU the
    noise is drawn on the device by cuRAND, seeded from that stream (a run repeats on the same device, with
    other numbers than on the CPU). The patterns depend on ``seed`` only, so every run and every rank sees the
    same classes. A replica of a split batch (``cpu_parallel: REPLICAS``) draws the whole batch's labels and noise
    and keeps its samples' rows: the replicas train on what one process does.
    """

    param_blocks = {"synthetic_data": {
        "batch_size": Field("int", REQUIRED, min=1, doc="images per batch (N)"),
        "shape": Field("ints", REQUIRED, min=1, doc="the shape of one image (C, H, W)"),
        "classes": Field("int", REQUIRED, min=1, doc="labels are 0 .. classes - 1, balanced in every batch"),
        "grid": Field("int", 4, min=1, doc="each pattern is grid x grid blocks per channel"),
        "noise": Field("float", 0.5, min=0, doc="standard deviation of the noise, relative to the patterns' 1"),
        "scale": Field("float", 1.0, doc="multiplies the images (patterns and noise)"),
        "seed": Field("int", 0, min=0, doc="draws the class patterns"),
    }}
    num_bottom = (0, 0)
    num_top = (2, 2)
    backward_reads = ()
    has_backward = False
    capturable = False  # new host-drawn labels and noise every forward

    @classmethod
    def validate_params(cls, lp):
        p = lp.synthetic_data
        if len(p.shape) != 3:
            raise lp.error(f"shape is one image's (C, H, W), got {len(p.shape)} values", "synthetic_data.shape")
        if p.grid > min(p.shape[1:]):
            raise lp.error(f"grid {p.grid} is larger than the images ({p.shape[1]}x{p.shape[2]})",
                           "synthetic_data.grid")

    def layer_setup(self, bottom, top):
        p = self.layer_param.synthetic_data
        self.batch_size, self.image_shape, self.classes = p.batch_size, tuple(p.shape), p.classes
        self.grid, self.noise, self.scale, self.seed = p.grid, p.noise, p.scale, p.seed
        self._blocks = {}  # class -> its (C, grid, grid) values, drawn when the class first appears
        self._pixel_blocks = None  # block_of_pixel() on the layer's xp, made at the first forward

    def reshape(self, bottom, top):
        top[0].reshape((self.batch_size,) + self.image_shape)
        top[1].reshape(self.batch_size)

    def block(self, k):
        """Class ``k``'s (C, grid, grid) values, drawn from ``(seed, k)`` when the class first appears."""
        if k not in self._blocks:  # only the blocks are kept: 1,000 ImageNet-sized patterns would take 600 MB
            self._blocks[k] = numpy.random.default_rng([self.seed, k]).standard_normal(
                (self.image_shape[0], self.grid, self.grid), dtype=numpy.float32)
        return self._blocks[k]

    def block_of_pixel(self, xp=numpy):
        """``(rows, cols)``: the block each row (H, 1) and column (W,) of pixels falls in, on ``xp``."""
        h, w = self.image_shape[1:]
        return xp.asarray((numpy.arange(h) * self.grid // h)[:, None]), xp.asarray(numpy.arange(w) * self.grid // w)

    def pattern(self, k):
        """Class ``k``'s pattern (C, H, W), float32, before ``scale``."""
        rows, cols = self.block_of_pixel()
        return self.block(k)[:, rows, cols]

    def draw_labels(self, g, n):
        """``n`` labels, every class n // classes or n // classes + 1 times, in random order."""
        extra = g.choice(self.classes, n % self.classes, replace=False)
        return g.permutation(numpy.concatenate([numpy.repeat(numpy.arange(self.classes), n // self.classes), extra]))

    def forward(self, bottom, top):
        xp, g, split = self.xp, rng.get_rng(), self.batch_split
        # a replica of a split batch draws the whole batch, as one process does, and keeps its samples' rows
        labels = self.draw_labels(g, self.batch_size * (split[1] if split else 1))
        if split:
            labels = labels[split[0]::split[1]]
        shape = (self.batch_size,) + self.image_shape
        if xp is numpy:
            images = rng.batch_draw(lambda s: g.standard_normal(s, dtype=numpy.float32), shape, split)
        else:  # drawn on the device: ResNet-50's batch of 64 is 38 MB of noise, ~100 ms of a host core a batch
            seed = numpy.uint64(g.integers(2 ** 63))  # cupy takes a seed only as an unsigned (safe-cast) value
            images = xp.random.RandomState(seed).standard_normal(shape, dtype=numpy.float32)
        if self._pixel_blocks is None:
            self._pixel_blocks = self.block_of_pixel(xp)
        rows, cols = self._pixel_blocks
        blocks = xp.asarray(numpy.stack([self.block(int(k)) for k in labels]))  # (N, C, grid, grid)
        images *= numpy.float32(self.noise)
        images += blocks[:, :, rows, cols]
        images *= numpy.float32(self.scale)
        top[0].data[...] = images.astype(self.dtype, copy=False)
        top[1].data[...] = xp.asarray(labels, dtype=self.dtype)

    def backward(self, top, propagate_down, bottom):
        pass
