"""ONNX export of a built Net's inference graph (deploy / TEST phase), checked by onnxruntime in the tests.

The export walks ``net.layers`` once; one small function per layer type (registered by the Caffe type
name, as layers are) appends ONNX nodes and initializers. Layers without bottoms (Input, DummyData, data
layers) become graph inputs, except their tops that only losses and accuracies read (labels); losses,
accuracies and Silence are left out, and what they read becomes a graph output, so a net with
``SoftmaxWithLoss`` on ``fc8`` exports ``fc8``. Shapes are the built net's (its batch size included: build
the net with the batch you want, e.g. ``layerforge export --batch 1``). Blob names keep Caffe's names; an
in-place layer's output gets ``name__1``, ``name__2``... since ONNX values are written once.
"""
import numpy

from ..errors import ConfigError
from ..registry import registrar

EXPORTERS = {}
register_exporter = registrar(EXPORTERS, "ONNX exporter")
register_exporter.__doc__ = "Decorator: ``fn(graph, layer, bottoms, tops)`` writes one layer type's ONNX nodes."

OPSET = 17
# Layer types that read labels or only report: not part of an inference graph.
SKIPPED = {"Accuracy", "Silence"}


class Graph:
    """The ONNX graph being built: nodes, initializers, and the current ONNX value of each blob name."""

    def __init__(self, net, dtype):
        from onnx import helper

        self.helper, self.net, self.dtype = helper, net, dtype
        self.nodes, self.initializers, self.value, self.used = [], [], {}, set()

    def fresh(self, name):
        """A value name not used yet: ``name``, else ``name__1``, ``name__2``..."""
        out, k = name, 0
        while out in self.used:
            k += 1
            out = f"{name}__{k}"
        self.used.add(out)
        return out

    def const(self, name, array, dtype=None):
        """Add an initializer; returns its value name."""
        from onnx import numpy_helper

        array = numpy.asarray(array, dtype=dtype or self.dtype)
        value = self.fresh(name)
        self.initializers.append(numpy_helper.from_array(array, value))
        return value

    def node(self, op, inputs, outputs=None, name=None, **attrs):
        """Add a node; ``outputs`` are new value names (one fresh temporary when None); returns them."""
        outputs = outputs or [self.fresh(f"{name or op}_out")]
        self.nodes.append(self.helper.make_node(op, list(inputs), list(outputs), name=self.fresh(name or op), **attrs))
        return outputs

    def output_names(self, tops):
        """Fresh ONNX value names for a layer's top blobs, recorded as those blobs' current values."""
        names = [self.fresh(t) for t in tops]
        for t, n in zip(tops, names):
            self.value[t] = n
        return names


def _is_loss(layer):
    return layer.default_loss_weight > 0 or layer.type in SKIPPED


def export_onnx(net, path=None, opset=OPSET):
    """The ONNX model (``onnx.ModelProto``) of ``net``'s inference graph; written to ``path`` when given.

    Raises ConfigError naming the layer for a layer type or setting that ONNX cannot express.
    """
    import onnx
    from onnx import TensorProto, helper

    dtype = numpy.dtype(net.dtype)
    elem = {numpy.dtype("float32"): TensorProto.FLOAT, numpy.dtype("float64"): TensorProto.DOUBLE}[dtype]
    graph = Graph(net, dtype)
    kept = [i for i, layer in enumerate(net.layers) if not _is_loss(layer)]
    candidates = {}  # data-layer top -> its value info; only those that a node reads become graph inputs
    for i in kept:
        layer = net.layers[i]
        bottoms, tops = net.bottom_names(i), net.top_names(i)
        if not bottoms:
            for t in tops:
                graph.value[t] = graph.fresh(t)
                candidates[graph.value[t]] = helper.make_tensor_value_info(graph.value[t], elem,
                                                                           list(net.blobs[t].shape))
            continue
        convert = EXPORTERS.get(layer.type)
        if convert is None:
            raise _error(layer, f"ONNX export has no mapping for layer type {layer.type}")
        convert(graph, layer, [graph.value[b] for b in bottoms], tops)
    read = {name for node in graph.nodes for name in node.input}
    inputs = [info for name, info in candidates.items() if name in read]
    # outputs: what the net outputs and what its losses and accuracies read, where a layer computed it
    wanted = [t for i in kept for t in net.top_names(i) if t in net.outputs]
    wanted += [b for i, layer in enumerate(net.layers) if _is_loss(layer) for b in net.bottom_names(i)]
    outputs, seen = [], set()
    for name in wanted:
        value = graph.value.get(name)
        if value is None or value in candidates or value in seen:
            continue  # not exported, a label or raw input, or already an output
        seen.add(value)
        outputs.append(helper.make_tensor_value_info(value, elem, list(net.blobs[name].shape)))
    model = helper.make_model(helper.make_graph(graph.nodes, net.name or "net", inputs, outputs, graph.initializers),
                              opset_imports=[helper.make_opsetid("", opset)], producer_name="layerforge")
    model.ir_version = min(model.ir_version, 9)  # readable by older runtimes too
    data = model.SerializeToString()  # once, for the checker and the file: VGG-16's takes a second
    onnx.checker.check_model(data)
    if path is not None:
        try:
            with open(path, "wb") as f:
                f.write(data)
        except OSError as e:
            raise ConfigError(f"cannot write: {e.strerror}", path) from None
    return model


def _error(layer, message, key=None):
    lp = layer.layer_param
    return ConfigError(message, lp.path, lp.line_of(key.split(".")[0]) if key else lp.line, lp.name, lp.type, key)


def _param(layer, i):
    return layer.blobs[i].data if i < len(layer.blobs) else None


# -- learnable ----------------------------------------------------------------------------------

def _conv_geometry(layer):
    """(kernel, strides, pads, dilations) as ONNX lists, for 2-D and N-d layers with the channel axis 1."""
    if layer.nd:
        if layer.axis != 1:
            raise _error(layer, f"ONNX export needs the channel axis 1, not {layer.axis}", "convolution.axis")
        if not layer.geometry[0]:
            raise _error(layer, "ONNX export needs a spatial axis after the channel axis; this layer has none",
                         "convolution.axis")
        kernel, stride, pad, dilation = (list(v) for v in layer.geometry)
        return kernel, stride, pad + pad, dilation
    kh, kw, sy, sx, ph, pw, dy, dx = layer.geometry
    return [kh, kw], [sy, sx], [ph, pw, ph, pw], [dy, dx]


@register_exporter("Convolution")
def _convolution(g, layer, x, tops):
    kernel, strides, pads, dilations = _conv_geometry(layer)
    for xi, top in zip(x, tops):
        w = g.const(f"{layer.name}_W", _param(layer, 0))
        ins = [xi, w] + ([g.const(f"{layer.name}_b", _param(layer, 1))] if layer.bias_term else [])
        g.node("Conv", ins, g.output_names([top]), layer.name, kernel_shape=kernel, strides=strides, pads=pads,
               dilations=dilations, group=layer.group)


@register_exporter("Deconvolution")
def _deconvolution(g, layer, x, tops):
    kernel, strides, pads, dilations = _conv_geometry(layer)
    for xi, top in zip(x, tops):
        w = g.const(f"{layer.name}_W", _param(layer, 0))  # Caffe's (Cin, Cout / G, *k) is ONNX's layout too
        ins = [xi, w] + ([g.const(f"{layer.name}_b", _param(layer, 1))] if layer.bias_term else [])
        g.node("ConvTranspose", ins, g.output_names([top]), layer.name, kernel_shape=kernel, strides=strides,
               pads=pads, dilations=dilations, group=layer.group)


@register_exporter("InnerProduct")
def _inner_product(g, layer, x, tops):
    p = layer.layer_param.inner_product
    shape = g.net.blobs[tops[0]].shape
    ndim = len(g.net.blobs[layer_bottom(g, layer, 0)].shape)
    axis = p.axis + ndim if p.axis < 0 else p.axis
    flat = g.node("Flatten", x, name=f"{layer.name}_flatten", axis=axis)
    ins = flat + [g.const(f"{layer.name}_W", _param(layer, 0))]
    if layer.bias_term:
        ins.append(g.const(f"{layer.name}_b", _param(layer, 1)))
    if len(shape) == 2:
        g.node("Gemm", ins, g.output_names(tops), layer.name, transB=0 if p.transpose else 1)
    else:
        y = g.node("Gemm", ins, name=layer.name, transB=0 if p.transpose else 1)
        _reshape_to(g, layer, y, tops)


def _reshape_to(g, layer, x, tops):
    shape = g.const(f"{layer.name}_shape", numpy.array(g.net.blobs[tops[0]].shape, numpy.int64), numpy.int64)
    g.node("Reshape", [x[0], shape], g.output_names(tops), f"{layer.name}_reshape")


@register_exporter("PReLU")
def _prelu(g, layer, x, tops):
    slope = _param(layer, 0)
    ndim = len(g.net.blobs[tops[0]].shape)
    slope = slope.reshape(slope.shape + (1,) * (ndim - 2)) if slope.ndim else slope.reshape(())
    g.node("PRelu", [x[0], g.const(f"{layer.name}_slope", slope)], g.output_names(tops), layer.name)


@register_exporter("BatchNorm")
def _batch_norm(g, layer, x, tops):
    if not layer.use_global_stats:
        raise _error(layer, "ONNX export needs the running statistics (use_global_stats true, as in TEST)",
                     "batch_norm.use_global_stats")
    s = float(_param(layer, 2).reshape(-1)[0])
    factor = 0.0 if s == 0 else 1.0 / s  # Caffe's scale factor: the running sums are divided by it
    c = layer.channels
    ins = [x[0], g.const(f"{layer.name}_scale", numpy.ones(c)), g.const(f"{layer.name}_bias", numpy.zeros(c)),
           g.const(f"{layer.name}_mean", _param(layer, 0) * factor),
           g.const(f"{layer.name}_var", _param(layer, 1) * factor)]
    g.node("BatchNormalization", ins, g.output_names(tops), layer.name,
           epsilon=float(layer.layer_param.batch_norm.eps))


@register_exporter("Scale")
def _scale(g, layer, x, tops):
    ndim = len(g.net.blobs[tops[0]].shape)
    if len(x) > 1:
        scale_shape = g.net.blobs[layer_bottom(g, layer, 1)].shape
        trailing = ndim - layer.axis - len(scale_shape)
        shape = g.const(f"{layer.name}_scale_shape", numpy.array(scale_shape + (1,) * trailing, numpy.int64),
                        numpy.int64)
        scale = g.node("Reshape", [x[1], shape], name=f"{layer.name}_scale_reshape")[0]
    else:
        scale_shape = _param(layer, 0).shape
        trailing = ndim - layer.axis - len(scale_shape)
        scale = g.const(f"{layer.name}_scale", _param(layer, 0).reshape(scale_shape + (1,) * trailing))
    if not layer.layer_param.scale.bias_term:
        g.node("Mul", [x[0], scale], g.output_names(tops), layer.name)
        return
    bias = _param(layer, len(layer.blobs) - 1)
    y = g.node("Mul", [x[0], scale], name=layer.name)
    g.node("Add", y + [g.const(f"{layer.name}_bias", bias.reshape(scale_shape + (1,) * trailing))],
           g.output_names(tops), f"{layer.name}_bias")


def layer_bottom(g, layer, k):
    """The blob name of ``layer``'s bottom ``k``."""
    return g.net.bottom_names(g.net.layers.index(layer))[k]


# -- pooling and normalisation ------------------------------------------------------------------

@register_exporter("Pooling")
def _pooling(g, layer, x, tops):
    if layer.pool not in ("MAX", "AVE"):
        raise _error(layer, f"ONNX export has no mapping for pool {layer.pool}", "pooling.pool")
    if len(tops) > 1:
        raise _error(layer, "ONNX export cannot write MAX pooling's mask top", "top")
    if layer.global_pooling:
        g.node("GlobalMaxPool" if layer.pool == "MAX" else "GlobalAveragePool", x, g.output_names(tops), layer.name)
        return
    kh, kw, sy, sx, ph, pw = layer.kh, layer.kw, layer.sy, layer.sx, layer.ph, layer.pw
    attrs = dict(kernel_shape=[kh, kw], strides=[sy, sx], pads=[ph, pw, ph, pw], ceil_mode=int(layer.ceil_mode))
    if layer.pool == "MAX":
        g.node("MaxPool", x, g.output_names(tops), layer.name, **attrs)
    else:  # Caffe divides by the window clipped to the padded image: padding counts
        g.node("AveragePool", x, g.output_names(tops), layer.name, count_include_pad=1, **attrs)


@register_exporter("LRN")
def _lrn(g, layer, x, tops):
    p = layer.layer_param.lrn
    if p.norm_region == "ACROSS_CHANNELS":
        g.node("LRN", x, g.output_names(tops), layer.name, size=p.local_size, alpha=float(p.alpha),
               beta=float(p.beta), bias=float(p.k))
        return
    # WITHIN_CHANNEL: x / (1 + alpha/n^2 sum over the n x n window of x^2)^beta; the average over a
    # zero-padded window (padding counted) is that sum / n^2
    n, pad = p.local_size, (p.local_size - 1) // 2
    sq = g.node("Mul", [x[0], x[0]], name=f"{layer.name}_square")
    mean = g.node("AveragePool", sq, name=f"{layer.name}_window", kernel_shape=[n, n], strides=[1, 1],
                  pads=[pad, pad, pad, pad], count_include_pad=1)
    scaled = g.node("Mul", mean + [g.const(f"{layer.name}_alpha", numpy.array(p.alpha))], name=f"{layer.name}_alpha")
    base = g.node("Add", scaled + [g.const(f"{layer.name}_one", numpy.array(1.0))], name=f"{layer.name}_shift")
    power = g.node("Pow", base + [g.const(f"{layer.name}_beta", numpy.array(-p.beta))], name=f"{layer.name}_power")
    g.node("Mul", [x[0]] + power, g.output_names(tops), layer.name)


# -- element-wise and plumbing ------------------------------------------------------------------

@register_exporter("ReLU")
def _relu(g, layer, x, tops):
    slope = layer.layer_param.relu.negative_slope
    if slope == 0:
        g.node("Relu", x, g.output_names(tops), layer.name)
    else:
        g.node("LeakyRelu", x, g.output_names(tops), layer.name, alpha=float(slope))


def _unary(op, **attrs):
    def convert(g, layer, x, tops):
        g.node(op, x, g.output_names(tops), layer.name, **{k: v(layer) for k, v in attrs.items()})
    return convert


register_exporter("Sigmoid")(_unary("Sigmoid"))
register_exporter("TanH")(_unary("Tanh"))
register_exporter("ELU")(_unary("Elu", alpha=lambda layer: float(layer.layer_param.elu.alpha)))
register_exporter("Softmax")(_unary("Softmax", axis=lambda layer: int(layer.layer_param.softmax.axis)))


@register_exporter("Dropout")
def _dropout(g, layer, x, tops):
    """The identity (Caffe scales at training time), times 1 - p with Fast R-CNN's ``scale_train: false``; Monte
    Carlo dropout (the SegNet fork's ``sample_weights_test``) is ONNX's Dropout in training mode, which scales by
    1 / (1 - p) as Caffe does."""
    if not layer.samples:
        if layer.test_scale == 1.0:
            g.node("Identity", x, g.output_names(tops), layer.name)
        else:
            g.node("Mul", [x[0], g.const(f"{layer.name}_scale", layer.test_scale)], g.output_names(tops), layer.name)
        return
    inputs = [x[0], g.const(f"{layer.name}_ratio", layer.ratio),
              g.const(f"{layer.name}_training_mode", True, dtype=numpy.bool_)]
    if layer.scale == 1.0 / (1.0 - layer.ratio):
        g.node("Dropout", inputs, g.output_names(tops), layer.name)
    else:  # scale_train false as well: undo ONNX's scaling
        out = g.output_names(tops)
        dropped = g.node("Dropout", inputs, name=layer.name)
        g.node("Mul", [dropped[0], g.const(f"{layer.name}_scale", 1.0 - layer.ratio)], out, f"{layer.name}_scale")


@register_exporter("Split")
def _split(g, layer, x, tops):
    for t in tops:  # every top is the bottom's value
        g.value[t] = x[0]


@register_exporter("Flatten")
@register_exporter("Reshape")
def _reshape(g, layer, x, tops):
    _reshape_to(g, layer, x, tops)


@register_exporter("Concat")
def _concat(g, layer, x, tops):
    g.node("Concat", x, g.output_names(tops), layer.name, axis=int(layer.axis))


@register_exporter("Slice")
def _slice(g, layer, x, tops):
    axis = layer.axis
    sizes = g.const(f"{layer.name}_sizes", numpy.array([g.net.blobs[t].shape[axis] for t in tops], numpy.int64),
                    numpy.int64)
    g.node("Split", [x[0], sizes], g.output_names(tops), layer.name, axis=int(axis))


@register_exporter("Eltwise")
def _eltwise(g, layer, x, tops):
    p = layer.layer_param.eltwise
    if p.operation == "PROD":
        acc = x[0]
        for k, xi in enumerate(x[1:], start=1):
            acc = g.node("Mul", [acc, xi], g.output_names(tops) if k == len(x) - 1 else None, layer.name)[0]
    elif p.operation == "MAX":
        g.node("Max", x, g.output_names(tops), layer.name)
    else:
        terms = x
        if p.coeff and any(c != 1 for c in p.coeff):
            terms = [g.node("Mul", [xi, g.const(f"{layer.name}_coeff{k}", numpy.array(c))], name=f"{layer.name}_c{k}")[0]
                     for k, (xi, c) in enumerate(zip(x, p.coeff))]
        g.node("Sum", terms, g.output_names(tops), layer.name)
