"""Element-wise activations (Caffe's neuron layers): one bottom, one top of the same shape, in place allowed."""
import math

from ..backend import get_array_module
from ..errors import ShapeError
from ..kernels.relu import relu_backward, relu_forward
from ..schema import REQUIRED, Params
from .base import FILLER, Field, Layer, register_layer


def _sigmoid(z):
    # 0.5 tanh(z/2) + 0.5 is the logistic function without overflow in exp(-z) for very negative z
    return 0.5 * get_array_module(z).tanh(0.5 * z) + 0.5


class NeuronLayer(Layer):
    """Base of element-wise layers: top has the bottom's shape; ``bottom[0] is top[0]`` (in place) is allowed.

    Layers whose backward needs the input call ``self.save_input(bottom, top)`` in forward and
    ``self.saved_input(bottom)`` in backward: in place the bottom data has been overwritten by then,
    so a copy is kept (Caffe's ``bottom_memory_``).
    """

    _input_copy = None

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)

    def save_input(self, bottom, top):
        in_place = bottom[0] is top[0] or bottom[0].data is top[0].data
        self._input_copy = bottom[0].data.copy() if in_place else None

    def saved_input(self, bottom):
        return bottom[0].data if self._input_copy is None else self._input_copy


@register_layer("ReLU")
class ReLU(NeuronLayer):
    """y = max(x, 0) + negative_slope * min(x, 0); dy/dx = 1 where x > 0, else negative_slope.

    With negative_slope >= 0, x > 0 exactly where y > 0, so backward reads only the top (in place is free);
    a negative slope breaks that, so forward keeps the mask x > 0 instead.
    """

    param_blocks = {"relu": {"negative_slope": Field("float", 0.0, doc="slope for x <= 0 (leaky ReLU)")}}
    backward_reads = ("top",)

    def layer_setup(self, bottom, top):
        self.negative_slope = self.layer_param.relu.negative_slope
        self.positive = None

    def forward(self, bottom, top):
        x = bottom[0].data
        if self.negative_slope < 0:
            self.positive = x > 0
        relu_forward(x, self.negative_slope, top[0].data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        gy = top[0].diff
        if self.negative_slope >= 0:
            relu_backward(gy, top[0].data, self.negative_slope, bottom[0].diff)
        else:
            bottom[0].diff[...] = get_array_module(gy).where(self.positive, gy, gy * self.negative_slope)


@register_layer("Sigmoid")
class Sigmoid(NeuronLayer):
    """y = 1 / (1 + exp(-x)); dy/dx = y (1 - y)."""

    backward_reads = ("top",)

    def forward(self, bottom, top):
        top[0].data[...] = _sigmoid(bottom[0].data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            y = top[0].data
            bottom[0].diff[...] = top[0].diff * y * (1 - y)


@register_layer("TanH")
class TanH(NeuronLayer):
    """y = tanh(x); dy/dx = 1 - y^2."""

    backward_reads = ("top",)

    def forward(self, bottom, top):
        top[0].data[...] = get_array_module(bottom[0].data).tanh(bottom[0].data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            y = top[0].data
            bottom[0].diff[...] = top[0].diff * (1 - y * y)


@register_layer("ELU")
class ELU(NeuronLayer):
    """y = x for x > 0, alpha (exp(x) - 1) otherwise; dy/dx = 1 for x > 0, y + alpha otherwise."""

    param_blocks = {"elu": {"alpha": Field("float", 1.0, doc="scale of the negative part")}}

    def layer_setup(self, bottom, top):
        self.alpha = self.layer_param.elu.alpha

    def forward(self, bottom, top):
        self.save_input(bottom, top)
        x = bottom[0].data
        xp = get_array_module(x)
        # exp of min(x, 0) so large positive inputs do not overflow in the branch where() discards
        top[0].data[...] = xp.where(x > 0, x, self.alpha * xp.expm1(xp.minimum(x, 0)))

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x, y, gy = self.saved_input(bottom), top[0].data, top[0].diff
        bottom[0].diff[...] = get_array_module(x).where(x > 0, gy, gy * (y + self.alpha))


@register_layer("PReLU")
class PReLU(NeuronLayer):
    """y = max(x, 0) + a_c min(x, 0) with a learnable slope per channel (axis 1), or one shared slope.

    Shapes: x, y (N, C, ...); ``blobs[0]`` is (C,), or () with ``channel_shared``.
    Gradients: dx = dy (1 if x > 0 else a_c); da_c += sum over all but axis 1 of dy x [x <= 0].
    """

    param_blocks = {"prelu": {
        "filler": Field(FILLER, None, doc="slope initialiser (default constant 0.25)"),
        "channel_shared": Field("bool", False, doc="one slope for all channels"),
    }}
    backward_reads = ("bottom",)

    def layer_setup(self, bottom, top):
        p = self.layer_param.prelu
        self.channel_shared = p.channel_shared
        filler = p.filler if p.given("filler") else Params({**p.filler.as_dict(), "type": "CONSTANT", "value": 0.25})
        self._check_axes(bottom[0].shape)
        self.blobs = [self.make_param(() if self.channel_shared else (bottom[0].shape[1],), filler)]

    @staticmethod
    def _check_axes(shape):
        if len(shape) < 2:
            raise ShapeError(f"PReLU needs a bottom of at least 2 axes (N, C, ...), got shape {shape}", key="bottom")

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        self._check_axes(shape)
        if not self.channel_shared and shape[1] != self.blobs[0].count:
            raise ShapeError(f"PReLU has {self.blobs[0].count} channel slopes but the bottom has shape {shape}",
                             key="bottom")
        top[0].reshape(shape)

    def _slope(self, x):
        a = self.blobs[0].data
        return a if self.channel_shared else a.reshape((1, -1) + (1,) * (x.ndim - 2))

    def forward(self, bottom, top):
        self.save_input(bottom, top)
        x = bottom[0].data
        xp = get_array_module(x)
        top[0].data[...] = xp.where(x > 0, x, x * self._slope(x))

    def backward(self, top, propagate_down, bottom):
        x, gy = self.saved_input(bottom), top[0].diff
        xp = get_array_module(x)
        negative = x <= 0
        ga = gy * x * negative
        if self.channel_shared:
            self.blobs[0].diff += ga.sum()
        else:
            self.blobs[0].diff += ga.sum(axis=tuple(i for i in range(x.ndim) if i != 1))
        if propagate_down[0]:
            bottom[0].diff[...] = gy * xp.where(negative, self._slope(x), 1.0)


@register_layer("AbsVal")
class AbsVal(NeuronLayer):
    """y = |x|; dy/dx = sign(x) (0 at x = 0)."""

    backward_reads = ("bottom",)

    def forward(self, bottom, top):
        self.save_input(bottom, top)
        get_array_module(bottom[0].data).abs(bottom[0].data, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            x = self.saved_input(bottom)
            bottom[0].diff[...] = top[0].diff * get_array_module(x).sign(x)


@register_layer("BNLL")
class BNLL(NeuronLayer):
    """Binomial normal log likelihood, y = log(1 + exp(x)) (softplus); dy/dx = sigmoid(x).

    Computed as x + log(1 + exp(-x)) for x > 0 so exp never overflows; the gradient clamps x at 50
    as Caffe does (kBNLL_THRESHOLD).
    """

    backward_reads = ("bottom",)

    def forward(self, bottom, top):
        self.save_input(bottom, top)
        x = bottom[0].data
        xp = get_array_module(x)
        top[0].data[...] = xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            x = self.saved_input(bottom)
            e = get_array_module(x).exp(get_array_module(x).minimum(x, 50.0))
            bottom[0].diff[...] = top[0].diff * e / (e + 1)


@register_layer("Clip")
class Clip(NeuronLayer):
    """y = min(max(x, min), max); dy/dx = 1 where min <= x <= max, else 0."""

    param_blocks = {"clip": {"min": Field("float", REQUIRED, doc="lower bound"),
                             "max": Field("float", REQUIRED, doc="upper bound")}}
    backward_reads = ("bottom",)

    @classmethod
    def validate_params(cls, lp):
        if lp.clip.min > lp.clip.max:
            raise lp.error(f"min {lp.clip.min:g} is larger than max {lp.clip.max:g}", "clip.min")

    def forward(self, bottom, top):
        self.save_input(bottom, top)
        p = self.layer_param.clip
        get_array_module(bottom[0].data).clip(bottom[0].data, p.min, p.max, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            p, x = self.layer_param.clip, self.saved_input(bottom)
            bottom[0].diff[...] = top[0].diff * ((x >= p.min) & (x <= p.max))


class _BaseShiftScale(NeuronLayer):
    """Exp and Log: a ``base`` (-1 means e), a ``scale`` of x and a ``shift``, in the block named ``block``."""

    block = None

    @classmethod
    def params_block(cls, block):
        return {block: {"base": Field("float", -1.0, doc="the base; -1 means e"),
                        "scale": Field("float", 1.0, doc="multiplies x"),
                        "shift": Field("float", 0.0, doc="added to scale x")}}

    @classmethod
    def validate_params(cls, lp):
        base = getattr(lp, cls.block).base
        if base != -1 and base <= 0:
            raise lp.error(f"base must be positive or -1 (for e), got {base:g}", f"{cls.block}.base")

    def params(self):
        return getattr(self.layer_param, self.block)

    def log_base(self):
        return 1.0 if self.params().base == -1 else math.log(self.params().base)


@register_layer("Exp")
class Exp(_BaseShiftScale):
    """y = base^(shift + scale x) (base -1 means e); dy/dx = y ln(base) scale."""

    block = "exp"
    param_blocks = _BaseShiftScale.params_block("exp")
    backward_reads = ("top",)

    def layer_setup(self, bottom, top):
        p = self.params()
        self.inner_scale = self.log_base() * p.scale
        self.outer_scale = 1.0 if p.shift == 0 else math.exp(self.log_base() * p.shift)

    def forward(self, bottom, top):
        x = bottom[0].data
        top[0].data[...] = self.outer_scale * get_array_module(x).exp(self.inner_scale * x)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff * top[0].data * self.inner_scale


@register_layer("Log")
class Log(_BaseShiftScale):
    """y = log_base(shift + scale x) (base -1 means e); dy/dx = scale / ((shift + scale x) ln(base))."""

    block = "log"
    param_blocks = _BaseShiftScale.params_block("log")
    backward_reads = ("bottom",)

    @classmethod
    def validate_params(cls, lp):
        super().validate_params(lp)
        if lp.log.base == 1:
            raise lp.error("base 1 has no logarithm (1 / ln(1) is infinite)", "log.base")

    def forward(self, bottom, top):
        self.save_input(bottom, top)
        p, x = self.params(), bottom[0].data
        top[0].data[...] = get_array_module(x).log(p.shift + p.scale * x) / self.log_base()

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            p, x = self.params(), self.saved_input(bottom)
            bottom[0].diff[...] = top[0].diff * (p.scale / self.log_base()) / (p.shift + p.scale * x)


@register_layer("Power")
class Power(NeuronLayer):
    """y = (shift + scale x)^power; dy/dx = power scale (shift + scale x)^(power - 1) (0 when power or scale is 0)."""

    param_blocks = {"power": {"power": Field("float", 1.0, doc="the exponent"),
                              "scale": Field("float", 1.0, doc="multiplies x"),
                              "shift": Field("float", 0.0, doc="added to scale x")}}
    backward_reads = ("bottom",)

    def forward(self, bottom, top):
        self.save_input(bottom, top)
        p, x = self.layer_param.power, bottom[0].data
        xp = get_array_module(x)
        if p.power == 0 or p.scale == 0:  # a constant: (shift)^power, or 1 for power 0
            top[0].data[...] = 1.0 if p.power == 0 else p.shift ** p.power
        else:
            top[0].data[...] = xp.power(p.shift + p.scale * x, p.power)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        p, x = self.layer_param.power, self.saved_input(bottom)
        if p.power == 0 or p.scale == 0:
            bottom[0].diff[...] = 0
        elif p.power == 1:
            bottom[0].diff[...] = top[0].diff * p.scale
        else:
            xp = get_array_module(x)
            bottom[0].diff[...] = top[0].diff * (p.power * p.scale) * xp.power(p.shift + p.scale * x, p.power - 1)


@register_layer("Swish")
class Swish(NeuronLayer):
    """y = x sigmoid(beta x); dy/dx = beta y + sigmoid(beta x) (1 - beta y)."""

    param_blocks = {"swish": {"beta": Field("float", 1.0, doc="the sigmoid's slope")}}
    backward_reads = ("bottom", "top")

    def forward(self, bottom, top):
        self.save_input(bottom, top)
        x = bottom[0].data
        top[0].data[...] = x * _sigmoid(self.layer_param.swish.beta * x)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            beta, x, y = self.layer_param.swish.beta, self.saved_input(bottom), top[0].data
            s = _sigmoid(beta * x)
            bottom[0].diff[...] = top[0].diff * (beta * y + s * (1 - beta * y))


@register_layer("Threshold")
class Threshold(NeuronLayer):
    """y = 1 where x > threshold, else 0. No backward (Caffe has none: the step has no useful gradient)."""

    param_blocks = {"threshold": {"threshold": Field("float", 0.0, doc="the step's position")}}
    backward_reads = ()
    has_backward = False

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data > self.layer_param.threshold.threshold

    def backward(self, top, propagate_down, bottom):
        pass
