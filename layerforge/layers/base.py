"""The layer contract (Caffe's Layer): count checks -> layer_setup -> reshape, then forward / backward.

A layer reads its parameters from ``self.layer_param`` (``self.layer_param.convolution.num_output``),
keeps learnable parameters in ``self.blobs`` (each a Blob with ``data`` and ``diff``), writes its
tops in ``forward(bottom, top)`` and, in ``backward(top, propagate_down, bottom)``, *assigns* bottom
diffs and *adds* to parameter diffs (parameter diffs accumulate because a shared parameter, or
``iter_size`` > 1, collects gradients from several passes).
"""
import numpy

from ..blob import Blob
from ..errors import ConfigError, ShapeError
from ..fillers import fill
from ..registry import registrar
from ..schema import FILLER, Field, LOSS  # noqa: F401  (re-exported for layer files)

LAYER_REGISTRY = {}


register_layer = registrar(LAYER_REGISTRY, "layer type")
register_layer.__doc__ = "Class decorator: make a Layer class available under its Caffe type name."


class Layer:
    """Base class of every layer.

    Class attributes a subclass sets:
        param_blocks: ``{block_name: {key: Field}}``, the type-specific YAML blocks it accepts.
        num_bottom, num_top: ``(min, max)`` blob counts; ``max`` None means unbounded.
        default_loss_weight: loss weight of top 0 when the YAML gives none (1 for loss layers).
        backward_reads: which of ``"bottom"`` / ``"top"`` data backward reads (lets the net free the rest).
        has_backward: False for layers that never propagate (data, Accuracy).
        overwrites_param_diffs: indices of ``self.blobs`` whose diff backward writes whole, as the first of the
            pass's writers, when told so by ``Blob.diff_to_overwrite`` (InnerProduct's weights): the net then
            does not clear them before the iteration (``Net.clear_param_diffs``).
        adds_bottom_diffs: True where backward can add its bottom gradients to the bottoms' diffs instead of writing
            them, for the bottom indices the net puts in ``bottom_diffs_added`` (Convolution): the consumers of a
            Split's tops then make the Split's sum themselves (``Net._sums_by_consumers``).
        learnable: False when ``self.blobs`` hold running statistics rather than weights (BatchNorm):
            the net gives them lr_mult 0 and does not count them as learnable parameters.
        capturable: False when replaying a recorded forward/backward (a CUDA graph, ``cuda_graph``) would not
            redo what the layer does: draws from the host random stream, host-side decisions, Python code.

    Set by the Net:
        batch_split: ``(index, count)`` when the net is one of ``count`` replicas, each computing one equal slice
            of the batch (``Net(split=...)``); layers that draw per-sample randomness draw through
            :func:`layerforge.rng.batch_draw` with it. None otherwise.
    """

    type = None
    param_blocks = {}
    num_bottom = (1, 1)
    num_top = (1, 1)
    default_loss_weight = 0.0
    backward_reads = ("bottom", "top")
    has_backward = True
    overwrites_param_diffs = ()
    adds_bottom_diffs = False
    bottom_diffs_added = frozenset()  # set by the Net (adds_bottom_diffs)
    learnable = True
    capturable = True
    batch_split = None

    def __init__(self, layer_param, phase="TRAIN", dtype=numpy.float32, xp=numpy):
        self.layer_param = layer_param
        self.name = layer_param.name
        self.phase = phase
        self.dtype = numpy.dtype(dtype)
        self.xp = xp
        self.blobs = []

    # -- the fixed sequence -------------------------------------------------------------------
    def setup(self, bottom, top):
        """Check blob counts, run ``layer_setup`` once, then ``reshape``."""
        self.check_blob_counts(self.layer_param, len(bottom), len(top))
        self.layer_setup(bottom, top)
        self.reshape(bottom, top)

    @classmethod
    def check_blob_counts(cls, lp, n_bottom, n_top):
        for what, n, (lo, hi) in (("bottom", n_bottom, cls.num_bottom), ("top", n_top, cls.num_top)):
            if n < lo or (hi is not None and n > hi):
                want = f"exactly {lo}" if lo == hi else (f"at least {lo}" if hi is None else f"{lo} to {hi}")
                raise ConfigError(f"{cls.type} takes {want} {what} blob(s), got {n}",
                                  lp.path, lp.line_of(what), lp.name, lp.type, what)

    def layer_setup(self, bottom, top):
        """One-time setup: read parameters, create ``self.blobs``."""

    def reshape(self, bottom, top):
        """Set top shapes (and internal buffers) from bottom shapes; raise ShapeError when they cannot connect."""
        raise NotImplementedError

    def forward(self, bottom, top):
        raise NotImplementedError

    def backward(self, top, propagate_down, bottom):
        """Write ``bottom[i].diff`` for each i with ``propagate_down[i]``; add into ``self.blobs[j].diff``."""
        raise NotImplementedError

    # -- hooks the net and tools use ------------------------------------------------------------
    def allow_force_backward(self, bottom_index):
        """False for bottoms that can never take a gradient (labels of a loss)."""
        return True

    def multiply_adds(self, bottom, top):
        """Forward multiply-accumulate count for the current shapes (conv and fc count; others 0)."""
        return 0

    # -- helpers for subclasses ---------------------------------------------------------------
    def make_param(self, shape, filler):
        """A new parameter Blob of ``shape`` filled as ``filler`` (a FILLER block) says.

        Raises ShapeError for a shape with a zero extent (an empty bottom, such as a 0x0x0 input, gives one):
        such a parameter holds nothing to learn, and fillers scaled by its fan-in would divide by zero.
        """
        if 0 in tuple(shape):
            raise ShapeError(f"its parameter would have shape {tuple(shape)}, with no values: an input of this "
                             f"layer is empty")
        blob = Blob(shape, self.dtype, self.xp)
        fill(blob.data, filler)
        return blob

    def __repr__(self):
        return f"<{type(self).__name__} '{self.name}'>"
