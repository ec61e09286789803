"""pycaffe's NetSpec: nets written as Python calls (``caffe.layers``, ``caffe.params``), made into Caffe's
NetParameter message, its prototxt text, or layerforge YAML.

``L.Convolution(bottom, kernel_size=5, num_output=20)`` describes a layer and returns its top (a tuple of
tops for ``ntop`` > 1, the layer itself for ``ntop=0``). Keyword arguments are fields of the layer's
``<type>_param`` message, or of LayerParameter itself (``param``, ``loss_weight``, ``include``, any
``*_param``); dicts become messages, lists repeated fields. ``in_place=True`` makes the tops the
bottoms. Names follow pycaffe's rules: a top assigned to a NetSpec attribute is named after it, a
layer after its first top, and anything unnamed ``<Type><k>`` in the order it is first reached.
"""
import collections

from ..caffe import caffe_pb
from ..errors import LayerforgeError


def _param_block_names():
    """``{"Convolution": "convolution", ...}``: each ``*_param`` field of LayerParameter by message type."""
    fields = caffe_pb.LayerParameter.DESCRIPTOR.fields
    return {f.message_type.name[:-len("Parameter")]: f.name[:-len("_param")]
            for f in fields if f.name.endswith("_param") and f.message_type is not None}


PARAM_BLOCKS = _param_block_names()
# layer types that share another type's parameter message (Caffe's NetSpec makes users spell
# convolution_param for these; here their own keywords work too)
PARAM_BLOCKS.update(Deconvolution="convolution", Im2col="convolution")


def assign(message, name, value):
    """Set field ``name`` of ``message`` from a Python value: dicts fill sub-messages, lists repeated fields
    (a single value given to a repeated field is a one-element list)."""
    field = getattr(message, name)
    repeated = hasattr(field, "extend")
    if repeated and not isinstance(value, (list, tuple)):
        value = [value]
    if isinstance(value, (list, tuple)):
        if value and isinstance(value[0], dict):
            for item in value:
                sub = field.add()
                for k, v in item.items():
                    assign(sub, k, v)
        else:
            field.extend(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            assign(field, k, v)
    else:
        setattr(message, name, value)


class Top:
    """Output ``n`` of the layer ``fn``."""

    def __init__(self, fn, n):
        self.fn, self.n = fn, n

    def to_proto(self):
        """A NetParameter with every layer this top needs."""
        return to_proto(self)


class Function:
    """One layer: its type, its bottoms (Tops) and its parameters."""

    def __init__(self, type_name, inputs, params):
        for k, top in enumerate(inputs):
            if not isinstance(top, Top):
                raise TypeError(f"{type_name} input {k} is not a Top (type is {type(top)})")
        params = dict(params)
        self.type_name, self.inputs = type_name, tuple(inputs)
        self.ntop = params.pop("ntop", 1)
        self.in_place = params.pop("in_place", False)
        self.params = params
        self.tops = tuple(Top(self, n) for n in range(self.ntop))

    def _name_of(self, top, names, counts):
        if top not in names:
            counts[top.fn.type_name] += 1
            names[top] = f"{top.fn.type_name}{counts[top.fn.type_name]}"
        return names[top]

    def _layer_name(self, names, counts):
        if self not in names:  # a layer without tops is named by its NetSpec attribute, when it has one
            if self.ntop > 0:
                names[self] = self._name_of(self.tops[0], names, counts)
            else:
                counts[self.type_name] += 1
                names[self] = f"{self.type_name}{counts[self.type_name]}"
        return names[self]

    def to_layer(self, layers, names, counts):
        """Add this layer (after the layers it reads) to ``layers`` ({Function: LayerParameter})."""
        if self in layers:
            return
        bottoms = []
        for top in self.inputs:
            top.fn.to_layer(layers, names, counts)
            bottoms.append(layers[top.fn].top[top.n])
        layer = caffe_pb.LayerParameter(type=self.type_name)
        layer.bottom.extend(bottoms)
        layer.top.extend(bottoms if self.in_place else [self._name_of(t, names, counts) for t in self.tops])
        layer.name = self._layer_name(names, counts)
        block = PARAM_BLOCKS.get(self.type_name)
        for key, value in self.params.items():
            if key.endswith("param") or block is None or not _has_field(getattr(layer, f"{block}_param"), key):
                if not _has_field(layer, key):
                    raise LayerforgeError(f"{self.type_name} layer '{layer.name}': no parameter '{key}' "
                                          f"(neither in {block or 'its'}_param nor in LayerParameter)")
                assign(layer, key, value)
            else:
                assign(getattr(layer, f"{block}_param"), key, value)
        layers[self] = layer


def _has_field(message, name):
    return name in message.DESCRIPTOR.fields_by_name


def to_proto(*tops):
    """A NetParameter with every layer the given tops need (names generated)."""
    layers, names, counts = collections.OrderedDict(), {}, collections.Counter()
    for top in tops:
        top.fn.to_layer(layers, names, counts)
    net = caffe_pb.NetParameter()
    net.layer.extend(layers.values())
    return net


class NetSpec:
    """Tops assigned as attributes (``n.conv1 = L.Convolution(...)``) name their blobs and layers."""

    def __init__(self):
        super().__setattr__("tops", collections.OrderedDict())

    def __setattr__(self, name, value):
        self.tops[name] = value

    def __getattr__(self, name):
        try:
            return self.tops[name]
        except KeyError:
            raise AttributeError(name) from None

    __setitem__ = __setattr__

    def __getitem__(self, name):
        return self.tops[name]

    # SSD's fork (weiliu89/caffe) adds these; its model_libs.py (VGGNetBody, CreateMultiBoxHead) uses them
    def __delitem__(self, name):
        del self.tops[name]

    def keys(self):
        """The names assigned so far, in order."""
        return list(self.tops)

    def vals(self):
        """The tops assigned so far, in order."""
        return list(self.tops.values())

    def update(self, name, params):
        """Add or change keyword parameters of the layer that makes top ``name``."""
        top = self.tops[name]
        (top if isinstance(top, Function) else top.fn).params.update(params)

    def to_proto(self):
        """A NetParameter of every layer the assigned tops need, named after the attributes."""
        names = {top: name for name, top in self.tops.items()}
        layers, counts = collections.OrderedDict(), collections.Counter()
        for top in self.tops.values():  # a Top, or a layer without tops (ntop=0)
            (top if isinstance(top, Function) else top.fn).to_layer(layers, names, counts)
        net = caffe_pb.NetParameter()
        net.layer.extend(layers.values())
        return net


class Layers:
    """``caffe.layers``: ``layers.<Type>(*bottoms, **params)`` describes a layer of that type."""

    def __getattr__(self, type_name):
        def layer(*bottoms, **params):
            fn = Function(type_name, bottoms, params)
            return fn if fn.ntop == 0 else (fn.tops[0] if fn.ntop == 1 else fn.tops)
        return layer


class Parameters:
    """``caffe.params``: ``params.Pooling.MAX`` is the enum value of PoolingParameter (or any field constant)."""

    def __getattr__(self, type_name):
        message = getattr(caffe_pb, f"{type_name}Parameter")

        class Constants:
            def __getattr__(self, name):
                return getattr(message, name)

        return Constants()


def to_prototxt(net):
    """A NetParameter as prototxt text (protobuf's text format, as ``str(net)`` gives)."""
    from google.protobuf import text_format

    return text_format.MessageToString(net)


def to_yaml(net, path="<NetSpec>"):
    """A NetParameter as layerforge's net YAML (through the prototxt converter)."""
    from ..solvers.caffe_import import convert_message
    from ..yaml_text import to_yaml as mapping_to_yaml
    from ..caffe.prototxt import parse

    return mapping_to_yaml(convert_message(parse(to_prototxt(net), path), path)[1])


layers = Layers()
params = Parameters()
