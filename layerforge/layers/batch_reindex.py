"""BatchReindex: pick and reorder items of a batch by an index bottom (Caffe's BatchReindexLayer)."""
from ..backend import get_array_module, to_numpy
from ..errors import DataError
from .base import Layer, register_layer


@register_layer("BatchReindex")
class BatchReindex(Layer):
    """y[i] = x[permut[i]]: x (N, ...), permut (M,) integer-valued indices in [0, N); y (M, ...).

    Backward: gx[n] = sum of gy[i] over the i with permut[i] = n (an index may repeat); no gradient into permut.
    """

    num_bottom = (2, 2)
    backward_reads = ("bottom",)

    def allow_force_backward(self, bottom_index):
        return bottom_index == 0

    def reshape(self, bottom, top):
        top[0].reshape((bottom[1].count,) + tuple(bottom[0].shape[1:]))

    def _index(self, bottom):
        xp = get_array_module(bottom[1].data)
        index = bottom[1].data.reshape(-1).astype(xp.int64)
        n = bottom[0].shape[0]
        bad = (index < 0) | (index >= n)
        if bool(bad.any()):
            k = int(to_numpy(bad).argmax())
            raise DataError(f"layer '{self.name}' (BatchReindex): index {float(to_numpy(bottom[1].data.reshape(-1))[k]):g} "
                            f"at position {k} is outside the batch [0, {n})")
        return index

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data[self._index(bottom)]

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        bottom[0].diff[...] = 0
        xp.add.at(bottom[0].diff, self._index(bottom), top[0].diff)
