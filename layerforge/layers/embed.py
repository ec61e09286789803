"""Embed: a learned lookup table from integer indices to vectors (Caffe's EmbedLayer)."""
from ..backend import get_array_module, to_numpy
from ..blob import SparseGradient
from ..errors import DataError
from ..schema import REQUIRED
from .base import FILLER, Field, Layer, register_layer


def embedding_rows(index, gy, input_dim):
    """The weight gradient of an embedding as (unique row indices, summed rows): only the rows used.

    ``index`` holds the looked-up rows (any shape), ``gy`` their output gradients (index.shape + (D,)).
    """
    grad = SparseGradient.coalesce(index.reshape(-1), gy.reshape(-1, gy.shape[-1]))
    return grad.indices, grad.rows


@register_layer("Embed")
class Embed(Layer):
    """y[..., :] = W[x[...], :] (+ b): x any shape of integer values in [0, input_dim); y x.shape + (num_output,).

    Blobs: W (input_dim, num_output), b (num_output,) with ``bias_term``. Backward: gW[k] += the sum of gy
    over the positions where x = k; gb += the sum of gy; the indices take no gradient. gW is added as rows
    (``Blob.add_sparse_diff``: a SparseGradient of the unique indices), so data-parallel training can send
    only those rows and ``sparse_update: lazy`` can update only them.
    """

    capturable = False  # its weight gradient is a host-side list of rows (Blob.add_sparse_diff)

    param_blocks = {"embed": {
        "num_output": Field("int", REQUIRED, min=1, doc="length of each vector (D)"),
        "input_dim": Field("int", REQUIRED, min=1, doc="number of rows: indices lie in [0, input_dim)"),
        "bias_term": Field("bool", True, doc="add a learned bias"),
        "weight_filler": Field(FILLER, doc="filler of W"),
        "bias_filler": Field(FILLER, doc="filler of b"),
    }}
    backward_reads = ("bottom",)

    def allow_force_backward(self, bottom_index):
        return False

    def layer_setup(self, bottom, top):
        p = self.layer_param.embed
        self.blobs = [self.make_param((p.input_dim, p.num_output), p.weight_filler)]
        self.blobs[0].sparse_rows = True
        if p.bias_term:
            self.blobs.append(self.make_param((p.num_output,), p.bias_filler))

    def reshape(self, bottom, top):
        top[0].reshape(tuple(bottom[0].shape) + (self.layer_param.embed.num_output,))

    def _index(self, bottom):
        x = bottom[0].data
        xp = get_array_module(x)
        index = x.astype(xp.int64)
        bad = (index != x) | (index < 0) | (index >= self.layer_param.embed.input_dim)
        if bool(bad.any()):
            k = int(to_numpy(bad.reshape(-1)).argmax())
            raise DataError(f"layer '{self.name}' (Embed): index {float(to_numpy(x.reshape(-1))[k]):g} at position "
                            f"{k} is not an integer in [0, {self.layer_param.embed.input_dim})")
        return index

    def forward(self, bottom, top):
        y = self.blobs[0].data[self._index(bottom)]
        if self.layer_param.embed.bias_term:
            y = y + self.blobs[1].data
        top[0].data[...] = y

    def backward(self, top, propagate_down, bottom):
        gy = top[0].diff
        rows, summed = embedding_rows(self._index(bottom), gy, self.layer_param.embed.input_dim)
        self.blobs[0].add_sparse_diff(rows, summed)
        if self.layer_param.embed.bias_term:
            self.blobs[1].diff += gy.reshape(-1, gy.shape[-1]).sum(axis=0)
