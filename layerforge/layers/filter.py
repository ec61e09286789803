"""Filter: keep the items whose selector is non-zero (Caffe's FilterLayer)."""
from ..backend import get_array_module
from ..errors import ShapeError
from .base import Layer, register_layer


@register_layer("Filter")
class Filter(Layer):
    """Tops k = bottoms k at the items n where the last bottom (the selector, N values) is non-zero.

    Shapes: K bottoms (N, ...) and the selector (N,) or (N, 1, ...); K tops (M, ...), M the number
    of selected items (the batch size changes with the data). Backward: gx[n] = gy[j] for the j-th
    selected n, 0 for the others; the selector takes no gradient.
    """

    capturable = False  # its top's size follows the selector's values

    num_bottom = (2, None)
    num_top = (1, None)
    backward_reads = ("bottom",)

    @classmethod
    def validate_params(cls, lp):
        if len(lp.top) != len(lp.bottom) - 1:
            raise lp.error(f"needs one top per bottom but the selector: {len(lp.bottom) - 1}, got {len(lp.top)}",
                           "top")

    def allow_force_backward(self, bottom_index):
        return bottom_index < len(self.layer_param.bottom) - 1

    def reshape(self, bottom, top):
        selector = bottom[-1]
        n = bottom[0].shape[0]
        if selector.count != n or any(b.shape[0] != n for b in bottom[:-1]):
            raise ShapeError(f"the selector (shape {selector.shape}) needs one value per item of every bottom "
                             f"(first axis {n})", key="bottom")
        self.selected = selector.data.reshape(-1) != 0
        m = int(self.selected.sum())
        for b, t in zip(bottom[:-1], top):
            t.reshape((m,) + tuple(b.shape[1:]))

    def forward(self, bottom, top):
        self.reshape(bottom, top)  # the batch size follows the selector's values
        for b, t in zip(bottom[:-1], top):
            t.data[...] = b.data[self.selected]

    def backward(self, top, propagate_down, bottom):
        xp = get_array_module(self.selected)
        index = xp.nonzero(self.selected)[0]
        for i, (b, t) in enumerate(zip(bottom[:-1], top)):
            if propagate_down[i]:
                b.diff[...] = 0
                b.diff[index] = t.diff
