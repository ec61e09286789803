"""Layers whose tops come from outside the graph: Input (the caller writes them) and DummyData (fillers)."""
import math

from .. import rng
from ..backend import get_array_module
from ..fillers import fill
from ..schema import REQUIRED
from .base import FILLER, Field, Layer, register_layer


def _shape_count_error(lp, block, key, n_given, n_top):
    if n_given not in (1, n_top):
        raise lp.error(f"gives {n_given} {key} entries for {n_top} tops (give one for all tops or one per top)",
                       f"{block}.{key}")


def _per_top(values, i):
    return values[0] if len(values) == 1 else values[i]


@register_layer("Input")
class Input(Layer):
    """Declares net inputs: top ``i`` gets ``shape[i]`` (or ``shape[0]`` for every top) at setup.

    Forward does nothing: the Net (or the caller) writes the input arrays into the top blobs. As in
    Caffe, ``reshape`` leaves the tops alone, so a caller may reshape an input blob and then reshape
    the net to feed a different batch or image size.
    """

    param_blocks = {"input": {"shape": Field("shapes", REQUIRED, doc="one shape per top, or one shape for all tops")}}
    num_bottom = (0, 0)
    num_top = (1, None)
    backward_reads = ()
    has_backward = False

    @classmethod
    def validate_params(cls, lp):
        _shape_count_error(lp, "input", "shape", len(lp.input.shape), len(lp.top))

    def layer_setup(self, bottom, top):
        shapes = self.layer_param.input.shape
        for i, t in enumerate(top):
            t.reshape(_per_top(shapes, i))

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        pass


@register_layer("DummyData")
class DummyData(Layer):
    """Tops of fixed shapes filled by fillers (Caffe's DummyDataLayer), for tests and benchmarks.

    ``shape`` and ``data_filler`` each give one entry for all tops or one per top (no filler means
    constant 0). Constant tops are filled once at setup; the others are refilled on every forward
    from the process random stream (``layerforge.rng``; a replica of a split batch fills the whole batch and
    keeps its samples' rows, as Dropout does). Caffe's legacy ``num``/``channels``/
    ``height``/``width`` lists (one value, or one per top) may replace ``shape``.
    """

    param_blocks = {"dummy_data": {
        "shape": Field("shapes", [], doc="one shape per top, or one shape for all tops"),
        "data_filler": Field([FILLER], [], doc="one filler per top, or one for all tops (default constant 0)"),
        "num": Field("ints", [], min=0, doc="legacy 4-D shape: N per top"),
        "channels": Field("ints", [], min=0, doc="legacy 4-D shape: C per top"),
        "height": Field("ints", [], min=0, doc="legacy 4-D shape: H per top"),
        "width": Field("ints", [], min=0, doc="legacy 4-D shape: W per top"),
        "integer": Field("bools", [], doc="layerforge: per top (or one for all), floor the filled values to integers, "
                                          "e.g. random class labels from a UNIFORM filler over [0, classes)"),
    }}
    num_bottom = (0, 0)
    num_top = (1, None)
    backward_reads = ()
    has_backward = False
    _LEGACY = ("num", "channels", "height", "width")

    @classmethod
    def validate_params(cls, lp):
        p, n_top = lp.dummy_data, len(lp.top)
        legacy = [k for k in cls._LEGACY if getattr(p, k)]
        if p.shape and legacy:
            raise lp.error("give either 'shape' or num/channels/height/width, not both", f"dummy_data.{legacy[0]}")
        if p.shape:
            _shape_count_error(lp, "dummy_data", "shape", len(p.shape), n_top)
        elif legacy:
            for k in cls._LEGACY:
                if not getattr(p, k):
                    raise lp.error("legacy shapes need all of num, channels, height and width", f"dummy_data.{k}")
                _shape_count_error(lp, "dummy_data", k, len(getattr(p, k)), n_top)
        else:
            raise lp.error("required key is missing", "dummy_data.shape")
        if p.data_filler:
            _shape_count_error(lp, "dummy_data", "data_filler", len(p.data_filler), n_top)
        if p.integer:
            _shape_count_error(lp, "dummy_data", "integer", len(p.integer), n_top)

    def layer_setup(self, bottom, top):
        p = self.layer_param.dummy_data
        for i, t in enumerate(top):
            if p.shape:
                t.reshape(_per_top(p.shape, i))
            else:
                t.reshape(tuple(_per_top(getattr(p, k), i) for k in self._LEGACY))
        self.fillers = [_per_top(p.data_filler, i) if p.data_filler else None for i in range(len(top))]
        self.refill = [f is not None and f.type != "CONSTANT" for f in self.fillers]
        self.integer = [bool(_per_top(p.integer, i)) if p.integer else False for i in range(len(top))]
        for i, (t, f) in enumerate(zip(top, self.fillers)):
            if f is None:
                t.data[...] = 0
            elif f.type == "CONSTANT":
                self._fill(i, t, f)

    def reshape(self, bottom, top):
        pass

    def _fill(self, i, t, f):
        if self.batch_split is None:
            self._filled(t.data, i, f)
        else:  # a replica of a split batch: the whole batch's values, this replica's samples (rng.batch_draw)
            xp = get_array_module(t.data)
            t.data[...] = rng.batch_draw(lambda shape: self._filled(xp.empty(shape, t.data.dtype), i, f),
                                         t.data.shape, self.batch_split)

    def _filled(self, data, i, f):
        fill(data, f)
        if self.integer[i]:
            xp = get_array_module(data)
            xp.floor(data, out=data)
            if f.type == "UNIFORM":  # a draw that rounds up to max itself stays inside [min, max)
                xp.minimum(data, math.ceil(f.max) - 1, out=data)
        return data

    def forward(self, bottom, top):
        for i, (t, f, refill) in enumerate(zip(top, self.fillers, self.refill)):
            if refill:
                self._fill(i, t, f)

    def backward(self, top, propagate_down, bottom):
        pass
