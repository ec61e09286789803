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

    def __call__(self, batch, rng):
        """Transform ``batch`` (N, C, H, W); ``rng`` (a numpy Generator) draws crops and mirrors in TRAIN."""
        n, c, h, w = batch.shape
        _, oh, ow = self.output_shape((c, h, w))
        train = self.phase == "TRAIN"
        if train and (oh, ow) != (h, w):
            h0 = rng.integers(0, h - oh + 1, size=n)
            w0 = rng.integers(0, w - ow + 1, size=n)
        else:
            h0 = numpy.full(n, (h - oh) // 2)
            w0 = numpy.full(n, (w - ow) // 2)
        flip = rng.integers(0, 2, size=n).astype(bool) if train and self.p.mirror else numpy.zeros(n, bool)
        out = numpy.empty((n, c, oh, ow), dtype=self.dtype)
        mean_value = numpy.asarray(self.p.mean_value, dtype=self.dtype).reshape(-1, 1, 1)
        for i in range(n):
            rows, cols = slice(h0[i], h0[i] + oh), slice(w0[i], w0[i] + ow)
            x = batch[i, :, rows, cols].astype(self.dtype)
            if self.mean is not None:
                x -= self.mean[:, rows, cols]
            elif mean_value.size:
                x -= mean_value
            if self.p.scale != 1.0:
                x *= self.dtype.type(self.p.scale)
            out[i] = x[:, :, ::-1] if flip[i] else x
        return out
