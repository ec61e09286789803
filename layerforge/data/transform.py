"""Caffe's TransformationParameter: crop, mirror, mean subtraction and scaling of a batch of images.

For each image x (C, H, W) with crop offset (h0, w0) and output size (C, h, w)::

    y[c, i, j] = (x[c, h0 + i, w0 + j'] - mean[c, h0 + i, w0 + j']) * scale

where j' = w - 1 - j when the image is mirrored, else j; ``mean`` is the ``mean_file`` array (cropped
at the same offset, as Caffe does), or ``mean_value`` broadcast per channel, or 0. In TRAIN the crop
offset is uniform over the valid positions and each image is mirrored with probability 1/2 when
``mirror`` is set; in TEST the crop is centred and nothing is mirrored (Caffe also mirrors at random in
TEST; we do not, so that test scores are deterministic).
"""
import os

import numpy

from ..errors import DataError
from ..kernels.threadpool import host_work, parallel_for
from ..schema import Field

TRANSFORM = {
    "scale": Field("float", 1.0, doc="multiply every value by this after mean subtraction (1/256 for MNIST)"),
    "mirror": Field("bool", False, doc="TRAIN: flip each image left-right with probability 1/2"),
    "crop_size": Field("int", 0, min=0, doc="crop a square of this side (random in TRAIN, centred in TEST); 0: none"),
    "mean_file": Field("str", None, doc="a .npy, .npz or Caffe .binaryproto mean image (C, H, W) "
                                        "(compute_image_mean writes them)"),
    "mean_value": Field("floats", [], doc="one mean, or one per channel, subtracted before scaling"),
}


def resolve_path(path):
    """A relative path resolves against the current directory, then the repository root."""
    if os.path.isabs(path) or os.path.exists(path):
        return path
    from . import repo_root
    candidate = os.path.join(repo_root(), path)
    return candidate if os.path.exists(candidate) else path


def load_mean(path):
    """The mean image (C, H, W) float32 from a .npy, a .npz holding ``mean`` (or a single array), or a Caffe
    .binaryproto."""
    resolved = resolve_path(path)
    if resolved.endswith(".binaryproto"):  # Caffe's mean file: a (1, C, H, W) BlobProto
        from ..caffe.blobproto import read_blobproto
        mean = read_blobproto(resolved)
    else:
        mean = _load_numpy_mean(path, resolved)
    if mean.ndim == 4 and mean.shape[0] == 1:
        mean = mean[0]
    if mean.ndim != 3:
        raise DataError(f"{path}: the mean must have shape (C, H, W), got {mean.shape}")
    return mean.astype(numpy.float32)


def _load_numpy_mean(path, resolved):
    try:
        loaded = numpy.load(resolved, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: cannot read the mean file: {e}") from None
    if isinstance(loaded, numpy.lib.npyio.NpzFile):
        with loaded:
            names = loaded.files
            if "mean" not in names and len(names) != 1:
                raise DataError(f"{path}: a .npz mean needs an array named 'mean', found {names}")
            return loaded["mean" if "mean" in names else names[0]]
    return loaded


class DataTransformer:
    """Applies a validated ``transform`` block to uint8/float32 batches (N, C, H, W) on the host.

    Args:
        params: the Params of a TRANSFORM block.
        phase: "TRAIN" or "TEST".
        dtype: dtype of the output batch.
        source: what the data come from, for error messages.
    """

    def __init__(self, params, phase="TRAIN", dtype=numpy.float32, source="data"):
        self.p, self.phase, self.dtype, self.source = params, phase, numpy.dtype(dtype), source
        if params.mean_file and params.mean_value:
            raise DataError(f"{source}: give transform.mean_file or transform.mean_value, not both")
        self.mean = load_mean(params.mean_file) if params.mean_file else None
        self._means = {}  # the mean as an array of each array module finish() ran with

    def output_shape(self, shape):
        """(C, h, w) of a transformed image of ``shape`` (C, H, W); checks crop, mean and channels."""
        c, h, w = shape
        crop = self.p.crop_size
        if crop and (crop > h or crop > w):
            raise DataError(f"{self.source}: transform.crop_size {crop} is larger than the images ({h}x{w})")
        if self.mean is not None and self.mean.shape != tuple(shape):
            raise DataError(f"{self.source}: mean_file {self.p.mean_file} has shape {self.mean.shape}, "
                            f"the images have {tuple(shape)}")
        if len(self.p.mean_value) not in (0, 1, c):
            raise DataError(f"{self.source}: transform.mean_value has {len(self.p.mean_value)} values "
                            f"for {c}-channel images")
        return (c, crop, crop) if crop else (c, h, w)

    def plan(self, n, shape, rng):
        """Crop offsets and mirror flags of ``n`` images of ``shape`` (C, H, W): ``(h0, w0, flip)``, arrays (n,).

        TRAIN draws the offsets (when cropping), then the flips (with ``mirror``) from ``rng``; TEST centres the
        crop and mirrors nothing.
        """
        c, h, w = shape
        _, oh, ow = self.output_shape(shape)
        train = self.phase == "TRAIN"
        if train and (oh, ow) != (h, w):
            h0 = rng.integers(0, h - oh + 1, size=n)
            w0 = rng.integers(0, w - ow + 1, size=n)
        else:
            h0 = numpy.full(n, (h - oh) // 2)
            w0 = numpy.full(n, (w - ow) // 2)
        flip = rng.integers(0, 2, size=n).astype(bool) if train and self.p.mirror else numpy.zeros(n, bool)
        return h0, w0, flip

    @staticmethod
    def crop_into(out, image, h0, w0, flip):
        """Copy the window of ``image`` (C, H, W) at (h0, w0) the size of ``out`` (C, h, w) into ``out``, flipped
        left-right when ``flip`` (a decode worker writes its crops straight into the batch this way)."""
        _, oh, ow = out.shape
        pixels = image.transpose(1, 2, 0)[h0:h0 + oh, w0:w0 + ow]
        if pixels.strides[1:] == (pixels.shape[2] * pixels.itemsize, pixels.itemsize):
            # an image OpenCV decoded is stored H, W, C: OpenCV splits it into out's channel planes in a fifth
            # of the time numpy's strided copy takes (9 against 43 us for 224 x 224 x 3)
            import cv2
            cv2.split(cv2.flip(pixels, 1) if flip else pixels, list(out))
        else:
            window = image[:, h0:h0 + oh, w0:w0 + ow]
            out[...] = window[:, :, ::-1] if flip else window

    def finish(self, xp, crops, plan, out):
        """``out = (crops - mean) * scale`` for crops (N, C, h, w) made by :meth:`crop_into` with ``plan``.

        Arrays of ``xp``: on a GPU the batch crosses to the device as it was read (uint8 for images, a quarter
        of the bytes of float32) and this runs there; on the host it runs on the kernel threads, a slice of the
        images each. A ``mean_file`` is cropped at each image's offset and flipped with it (Caffe subtracts,
        then mirrors; the crops are already mirrored).
        """
        h0, w0, flip = plan
        _, _, oh, ow = out.shape
        mean = self._mean_on(xp)
        scale = self.dtype.type(self.p.scale)

        def body(lo, hi):  # each subtraction casts the crops as it reads them: one pass, in the output dtype
            y = out[lo:hi]
            if self.mean is not None:
                for i in range(lo, hi):
                    window = mean[:, h0[i]:h0[i] + oh, w0[i]:w0[i] + ow]
                    xp.subtract(crops[i], window[:, :, ::-1] if flip[i] else window, out=y[i - lo], dtype=y.dtype)
            elif mean.size:
                xp.subtract(crops[lo:hi], mean, out=y, dtype=y.dtype)
            else:
                y[...] = crops[lo:hi]
            if scale != 1:
                y *= scale

        parallel_for(len(out), body, host_work(out))

    def _mean_on(self, xp):
        """The mean_file image, or the mean_value (C, 1, 1) in the output dtype, as an array of ``xp`` (kept)."""
        if xp not in self._means:
            host = self.mean if self.mean is not None else \
                numpy.asarray(self.p.mean_value, dtype=self.dtype).reshape(-1, 1, 1)
            self._means[xp] = xp.asarray(host)
        return self._means[xp]

    def restore(self, batch):
        """The pictures a transformed host ``batch`` (N, C, h, w) came from, as (h, w, C) uint8 arrays: times
        1 / scale, plus the mean, clipped to 0..255 and truncated (the SSD fork's TransformInv, which draws its
        detections on them). A mean_file must have the batch's (C, h, w)."""
        mean = self.mean if self.mean is not None else \
            numpy.asarray(self.p.mean_value, dtype=numpy.float64).reshape(-1, 1, 1)
        if self.mean is not None and self.mean.shape != batch.shape[1:]:
            raise DataError(f"{self.source}: mean_file {self.p.mean_file} has shape {self.mean.shape}, the images "
                            f"{tuple(batch.shape[1:])}")
        pixels = numpy.asarray(batch, numpy.float64) / self.p.scale + (mean if mean.size else 0.0)
        return list(numpy.clip(pixels, 0, 255).astype(numpy.uint8).transpose(0, 2, 3, 1))

    def __call__(self, batch, rng):
        """Transform a host ``batch`` (N, C, H, W) whole: :meth:`plan`, :meth:`crop_into` and :meth:`finish`."""
        n, c, h, w = batch.shape
        plan = self.plan(n, (c, h, w), rng)
        crops = numpy.empty((n,) + self.output_shape((c, h, w)), batch.dtype)
        for i in range(n):
            self.crop_into(crops[i], batch[i], plan[0][i], plan[1][i], plan[2][i])
        out = numpy.empty(crops.shape, self.dtype)
        self.finish(numpy, crops, plan, out)
        return out
