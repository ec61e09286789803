"""Joining and dividing blobs: Concat, Slice and Split (Caffe's concat/slice/split layers)."""
from ..errors import ShapeError
from ..kernels.threadpool import sum_into
from .base import Field, Layer, register_layer


def _axis(block, p, ndim, legacy):
    # Caffe: the legacy *_dim key, when given, wins over axis (it predates N-d blobs)
    axis, key = (getattr(p, legacy), legacy) if p.given(legacy) else (p.axis, "axis")
    a = axis + ndim if axis < 0 else axis
    if not 0 <= a < ndim:
        raise ShapeError(f"{key} {axis} is out of range for a bottom of {ndim} axes", key=f"{block}.{key}")
    return a


def _slab(axis, start, stop, ndim):
    index = [slice(None)] * ndim
    index[axis] = slice(start, stop)
    return tuple(index)


def _validate_axis_keys(lp, block, legacy):
    p = getattr(lp, block)
    if p.given("axis") and p.given(legacy):
        raise lp.error(f"give either 'axis' or the legacy '{legacy}', not both", f"{block}.{legacy}")


@register_layer("Concat")
class Concat(Layer):
    """Joins K bottoms along ``axis``: shapes (.., n_k, ..) -> (.., sum_k n_k, ..); all other axes must agree.

    Backward hands each bottom its slab of the top diff.
    """

    param_blocks = {"concat": {
        "axis": Field("int", 1, doc="axis to join along (negative counts from the end)"),
        "concat_dim": Field("int", 1, min=0, doc="legacy name of axis"),
    }}
    num_bottom = (1, None)
    backward_reads = ()

    @classmethod
    def validate_params(cls, lp):
        _validate_axis_keys(lp, "concat", "concat_dim")

    def reshape(self, bottom, top):
        ref = bottom[0].shape
        self.axis = _axis("concat", self.layer_param.concat, len(ref), "concat_dim")
        for i, b in enumerate(bottom[1:], 1):
            s = b.shape
            if len(s) != len(ref) or s[:self.axis] != ref[:self.axis] or s[self.axis + 1:] != ref[self.axis + 1:]:
                raise ShapeError(f"bottom[{i}] shape {s} does not match bottom[0] shape {ref} on the axes other "
                                 f"than the concat axis {self.axis}", key=f"bottom[{i}]")
        self.sizes = [b.shape[self.axis] for b in bottom]
        top[0].reshape(ref[:self.axis] + (sum(self.sizes),) + ref[self.axis + 1:])

    def forward(self, bottom, top):
        y, offset = top[0].data, 0
        for b, n in zip(bottom, self.sizes):
            y[_slab(self.axis, offset, offset + n, y.ndim)] = b.data
            offset += n

    def backward(self, top, propagate_down, bottom):
        gy, offset = top[0].diff, 0
        for b, n, down in zip(bottom, self.sizes, propagate_down):
            if down:
                b.diff[...] = gy[_slab(self.axis, offset, offset + n, gy.ndim)]
            offset += n


@register_layer("Slice")
class Slice(Layer):
    """Cuts one bottom along ``axis`` into K tops, at ``slice_point`` (K - 1 increasing offsets) or evenly.

    (N, 10, H, W) with slice_point [2, 5] -> (N, 2, H, W), (N, 3, H, W), (N, 5, H, W).
    """

    param_blocks = {"slice": {
        "axis": Field("int", 1, doc="axis to cut along (negative counts from the end)"),
        "slice_point": Field("ints", [], min=1, doc="offsets where a new top starts (one fewer than the tops)"),
        "slice_dim": Field("int", 1, min=0, doc="legacy name of axis"),
    }}
    num_top = (1, None)
    backward_reads = ()

    @classmethod
    def validate_params(cls, lp):
        _validate_axis_keys(lp, "slice", "slice_dim")
        points = lp.slice.slice_point
        if points:
            if len(points) != len(lp.top) - 1:
                raise lp.error(f"{len(points)} slice points make {len(points) + 1} pieces, but there are "
                               f"{len(lp.top)} tops", "slice.slice_point")
            if any(b <= a for a, b in zip(points, points[1:])):
                raise lp.error(f"slice points must increase strictly, got {points}", "slice.slice_point")

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        self.axis = _axis("slice", self.layer_param.slice, len(shape), "slice_dim")
        dim, points, k = shape[self.axis], self.layer_param.slice.slice_point, len(top)
        if points:
            if points[-1] >= dim:
                raise ShapeError(f"slice point {points[-1]} is not inside axis {self.axis} (size {dim}) of bottom "
                                 f"shape {shape}", key="slice.slice_point")
            bounds = [0] + list(points) + [dim]
        else:
            if dim % k:
                raise ShapeError(f"axis {self.axis} (size {dim}) of bottom shape {shape} does not split evenly "
                                 f"into {k} tops; give slice_point", key="slice.slice_point")
            bounds = [i * dim // k for i in range(k + 1)]
        self.bounds = bounds
        for i, t in enumerate(top):
            t.reshape(shape[:self.axis] + (bounds[i + 1] - bounds[i],) + shape[self.axis + 1:])

    def _index(self, i, ndim):
        return _slab(self.axis, self.bounds[i], self.bounds[i + 1], ndim)

    def forward(self, bottom, top):
        x = bottom[0].data
        for i, t in enumerate(top):
            t.data[...] = x[self._index(i, x.ndim)]

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            gx = bottom[0].diff
            for i, t in enumerate(top):
                gx[self._index(i, gx.ndim)] = t.diff


@register_layer("Split")
class Split(Layer):
    """Hands one bottom to N consumers: every top shares the bottom's data array (no copy).

    Backward sums the tops' diffs into the bottom diff. The Net inserts Split layers where a blob feeds
    several layers (Caffe names the tops ``<blob>_<layer>_<index>_split``); because the data is shared,
    no consumer may compute in place on a split top. Where the net plans its memory (training, ``layerforge
    time``) and the consumers can, they make the sum themselves, the tops sharing the bottom's diff (the first
    consumer backward meets writes it, the convolutions after it add to it), and the Split's backward is skipped.
    """

    num_top = (1, None)
    backward_reads = ()

    def reshape(self, bottom, top):
        for t in top:
            t.reshape(bottom[0].shape)
            t.share_data(bottom[0])

    def forward(self, bottom, top):
        # re-share in case the bottom's array was replaced since reshape
        for t in top:
            if t.data is not bottom[0].data:
                t.share_data(bottom[0])

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            sum_into(bottom[0].diff, *(t.diff for t in top))
