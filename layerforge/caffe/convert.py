"""Caffe NetParameter / SolverParameter messages -> layerforge YAML mappings.

The mapping is driven by layerforge's own schemas: a Caffe ``xxx_param`` message becomes the ``xxx`` block
of the layer type, and each of its fields must be a key of that block's schema (layerforge keeps Caffe's
names and defaults). A field that has no layerforge key is an error naming the field and its line, except
for the short lists below of fields that do not change results (``IGNORED``) or that are accepted only with
Caffe's default value (``DEFAULT_ONLY``). The converted mapping carries the prototxt's line numbers and is
validated by layerforge's own loaders, so every error reads ``NET.prototxt:LINE: layer ...: key ...``.
docs/caffe-import.md is the user's reference.
"""
import math
import os
import re
import textwrap

import yaml

from ..errors import ConfigError
from ..netdef import LAYER_KEYS, load_net_def
from ..schema import Field, LineDict, LineList
from .prototxt import Message, parse_file

# Fields dropped whatever their value: they choose an implementation or a file format, not a result.
IGNORED = {
    "*": {"engine"},                                     # CAFFE / CUDNN implementations compute the same function
    "net": {"debug_info"},                               # logging only
    "solver": {"debug_info", "snapshot_diff", "layer_wise_reduce"},
}

# Fields accepted only with Caffe's default value (which is what layerforge does), rejected otherwise.
DEFAULT_ONLY = {
    "dropout": {"scale_train": True},
    "transform": {"force_color": False, "force_gray": False},
    "data": {"force_encoded_color": False},
    "param": {"share_mode": "STRICT"},
}

# Layers Caffe accepts a transform_param on and ignores it (they are no DataLayer): pycaffe's own NetSpec
# example gives DummyData one.
TRANSFORM_IGNORED = ("DummyData", "Input")

# Caffe's deprecated data_param / image_data_param / window_data_param fields that its own upgrade moves into
# transform_param.
MOVED_TO_TRANSFORM = ("scale", "mean_file", "crop_size", "mirror")

# V1LayerParameter.LayerType -> type name (Caffe's UpgradeV1LayerType), with the enum numbers.
V1_TYPES = {
    "NONE": (0, None), "ABSVAL": (35, "AbsVal"), "ACCURACY": (1, "Accuracy"), "ARGMAX": (30, "ArgMax"),
    "BNLL": (2, "BNLL"), "CONCAT": (3, "Concat"), "CONTRASTIVE_LOSS": (37, "ContrastiveLoss"),
    "CONVOLUTION": (4, "Convolution"), "DATA": (5, "Data"), "DECONVOLUTION": (39, "Deconvolution"),
    "DROPOUT": (6, "Dropout"), "DUMMY_DATA": (32, "DummyData"), "EUCLIDEAN_LOSS": (7, "EuclideanLoss"),
    "ELTWISE": (25, "Eltwise"), "EXP": (38, "Exp"), "FLATTEN": (8, "Flatten"), "HDF5_DATA": (9, "HDF5Data"),
    "HDF5_OUTPUT": (10, "HDF5Output"), "HINGE_LOSS": (28, "HingeLoss"), "IM2COL": (11, "Im2col"),
    "IMAGE_DATA": (12, "ImageData"), "INFOGAIN_LOSS": (13, "InfogainLoss"), "INNER_PRODUCT": (14, "InnerProduct"),
    "LRN": (15, "LRN"), "MEMORY_DATA": (29, "MemoryData"),
    "MULTINOMIAL_LOGISTIC_LOSS": (16, "MultinomialLogisticLoss"), "MVN": (34, "MVN"), "POOLING": (17, "Pooling"),
    "POWER": (26, "Power"), "RELU": (18, "ReLU"), "SIGMOID": (19, "Sigmoid"),
    "SIGMOID_CROSS_ENTROPY_LOSS": (27, "SigmoidCrossEntropyLoss"), "SILENCE": (36, "Silence"),
    "SOFTMAX": (20, "Softmax"), "SOFTMAX_LOSS": (21, "SoftmaxWithLoss"), "SPLIT": (22, "Split"),
    "SLICE": (33, "Slice"), "TANH": (23, "TanH"), "WINDOW_DATA": (24, "WindowData"), "THRESHOLD": (31, "Threshold"),
}
V1_NUMBERS = {num: name for num, name in V1_TYPES.values()}

# SolverParameter.solver_type (deprecated enum) -> solver type name
SOLVER_TYPES = {"SGD": "SGD", "NESTEROV": "Nesterov", "ADAGRAD": "AdaGrad", "RMSPROP": "RMSProp",
                "ADADELTA": "AdaDelta", "ADAM": "Adam"}

NET_FIELDS = ("layer", "layers", "input", "input_shape", "input_dim", "force_backward", "state")
DATA_TYPES = ("Data", "ImageData", "HDF5Data", "WindowData")
LAYER_ORDER = ("name", "type", "bottom", "top", "include", "exclude", "param", "loss_weight", "propagate_down")


def _line_dict(line=None):
    d = LineDict()
    d.line, d.key_lines = line, {}
    return d


def _line_list(items, line=None):
    lst = LineList(items)
    lst.line = line
    return lst


def _put(d, key, value, line):
    d[key] = value
    d.key_lines[key] = line


def _shown(value):
    return "a message" if isinstance(value, Message) else repr(value) if isinstance(value, str) else str(value)


def default_net_name(path):
    """``examples/mnist/lenet_train_test.prototxt`` -> ``lenet_train_test.yaml``."""
    base = os.path.basename(str(path))
    return (base[:-len(".prototxt")] if base.endswith(".prototxt") else os.path.splitext(base)[0]) + ".yaml"


class Converter:
    """Converts one parsed file; ``notes`` collects what the user should know (paths kept as written ...)."""

    def __init__(self, path=None):
        self.path, self.notes = path, []

    def error(self, message, line, layer=None, layer_type=None, key=None):
        return ConfigError(message, self.path, line, layer, layer_type, key)

    # ---------------------------------------------------------------------------------------------
    # generic: a message against a layerforge schema

    def block(self, msg, schema, scope, where=(None, None), prefix=""):
        """``msg`` (a Message) -> LineDict of the keys of ``schema``; ``scope`` names the tables' entries."""
        out = _line_dict(msg.line)
        ignored = IGNORED["*"] | IGNORED.get(scope, set())
        defaults = DEFAULT_ONLY.get(scope, {})
        for name in msg.names():
            entries = msg.all(name)
            line, key = entries[0].line, prefix + name
            if name in ignored:
                continue
            if name in defaults:
                bad = [e for e in entries if e.value != defaults[name]]
                if bad:
                    raise self.error(f"Caffe field '{name}' is supported only with its default "
                                     f"{_shown(defaults[name])}, got {_shown(bad[0].value)}", bad[0].line, *where, key)
                continue
            if name not in schema:
                raise self.error(f"Caffe field '{name}' has no layerforge equivalent", line, *where, key)
            _put(out, name, self.value(entries, schema[name], name, where, key), line)
        return out

    def value(self, entries, field, name, where, key):
        kind = field.kind
        for e in entries:
            if isinstance(e.value, Message) != (isinstance(kind, (dict, list)) or kind in ("shapes", "dims")):
                what = "a message { ... }" if isinstance(e.value, Message) else f"the value {_shown(e.value)}"
                raise self.error(f"Caffe field '{name}' cannot be {what} here", e.line, *where, key)
        if isinstance(kind, dict):
            self.singular(entries, where, key)
            return self.block(entries[0].value, kind, name, where, key + ".")
        if isinstance(kind, list):
            items = [self.block(e.value, kind[0], name, where, key + ".") for e in entries]
            return items[0] if len(items) == 1 and name != "param" else _line_list(items, entries[0].line)
        if kind in ("shapes", "dims"):
            if kind == "dims":
                self.singular(entries, where, key)
            shapes = [self.shape(e, where, key) for e in entries]
            return shapes[0] if len(shapes) == 1 else _line_list(shapes, entries[0].line)
        scalar = {"ints": "int", "floats": "float", "strs": "str", "bools": "bool"}.get(kind)
        if scalar is None:
            self.singular(entries, where, key)
            return self.scalar(entries[0].value, kind)
        items = [self.scalar(e.value, scalar) for e in entries]
        return items[0] if len(items) == 1 else _line_list(items, entries[0].line)

    def singular(self, entries, where, key):
        if len(entries) > 1:
            raise self.error(f"non-repeated field given {len(entries)} times (also at line {entries[0].line})",
                             entries[1].line, *where, key)

    def shape(self, entry, where, key):
        msg = entry.value
        for name in msg.names():
            if name != "dim":
                raise self.error(f"Caffe field '{name}' has no layerforge equivalent in a BlobShape",
                                 msg.line_of(name), *where, f"{key}.{name}")
        return _line_list([self.scalar(v, "int") for v in msg.values("dim")], entry.line)

    @staticmethod
    def scalar(value, kind):
        if kind == "bool" and not isinstance(value, bool):
            # protobuf's text format also spells booleans t / f / 1 / 0
            return {"t": True, "f": False, 1: True, 0: False}.get(value, value)
        if kind in ("str", "enum") and isinstance(value, str):
            return str(value)
        return value

    # ---------------------------------------------------------------------------------------------
    # nets

    def net(self, msg):
        """NetParameter -> layerforge net mapping (validated)."""
        out = _line_dict(msg.line)
        if "layer" in msg and "layers" in msg:
            raise self.error("give 'layer' (current) or 'layers' (V1) entries, not both", msg.line_of("layers"))
        for name in msg.names():
            entries = msg.all(name)
            line = entries[0].line
            if name in IGNORED["net"] or name in ("layer", "layers"):
                continue
            if name == "name":
                _put(out, "name", self.value(entries, LAYER_KEYS["name"], name, (None, None), name), line)
            elif name in ("input", "input_dim"):
                field = LAYER_KEYS["top"] if name == "input" else _INTS
                _put(out, name, _as_list(self.value(entries, field, name, (None, None), name), line), line)
            elif name == "input_shape":
                shapes = [self.shape(e, (None, None), name) for e in entries]
                _put(out, name, _line_list(shapes, line), line)
            elif name == "force_backward":
                _put(out, name, self.value(entries, _BOOL, name, (None, None), name), line)
            elif name == "state":
                self.singular(entries, (None, None), name)
                _put(out, name, self.block(entries[0].value, _NET_STATE, "state", (None, None), "state."), line)
            else:
                raise self.error(f"Caffe field '{name}' has no layerforge equivalent", line, key=name)
        v1 = "layers" in msg
        layers = [self.layer(e.value, v1) for e in msg.all("layers" if v1 else "layer")]
        _put(out, "layers", _line_list(layers, msg.line_of("layers" if v1 else "layer")),
             msg.line_of("layers" if v1 else "layer"))
        try:
            load_net_def(out)
        except ConfigError as e:
            raise ConfigError(e.message, self.path, e.line, e.layer, e.layer_type, e.key) from None
        self.data_notes(out)
        return out

    def layer(self, msg, v1):
        from ..layers import LAYER_REGISTRY
        name = msg.get("name")
        if v1 and "layer" in msg:
            raise self.error("V0 layer definitions (layers { layer { ... } }) are not supported; upgrade the file "
                             "with Caffe's upgrade_net_proto_text first", msg.line_of("layer"), name)
        if "type" not in msg:
            raise self.error("layer has no 'type'", msg.line, name, key="type")
        type_line = msg.line_of("type")
        ltype = msg.get("type")
        if v1:
            v1_name = ltype
            ltype = V1_NUMBERS.get(ltype) if isinstance(ltype, int) else V1_TYPES.get(str(ltype), (0, None))[1]
            if ltype is None:
                raise self.error(f"unknown V1 layer type {v1_name}", type_line, name, key="type")
        ltype = str(ltype)
        if ltype not in LAYER_REGISTRY:
            raise self.error(f"unsupported layer type '{ltype}' (layerforge has no such layer)",
                             type_line, name, ltype, "type")
        cls, where = LAYER_REGISTRY[ltype], (name, ltype)
        common, blocks, v1_params, moved = _line_dict(msg.line), {}, {}, []
        for fname in msg.names():
            entries = msg.all(fname)
            line = entries[0].line
            if fname == "type":
                continue
            if v1 and fname in ("param", "blobs_lr", "weight_decay", "blob_share_mode"):
                v1_params[fname] = entries
            elif fname in LAYER_KEYS:
                _put(common, fname, self.value(entries, LAYER_KEYS[fname], fname, where, fname), line)
            elif fname.endswith("_param"):
                self.singular(entries, where, fname)
                block = fname[:-len("_param")]
                sub = entries[0].value
                if not isinstance(sub, Message):
                    raise self.error(f"'{fname}' must be a message {{ ... }}", line, *where, fname)
                if block in cls.param_blocks:
                    sub = self.split_moved(sub, block, moved, where)
                    blocks[block] = (self.block(sub, cls.param_blocks[block], block, where, fname + "."), line)
                elif block == "transform" and ltype in TRANSFORM_IGNORED:
                    self.notes.append(f"line {line}: layer '{where[0]}' ({ltype}): transform_param dropped "
                                      f"({ltype} layers do not transform their data, in Caffe either)")
                elif any(n not in IGNORED["*"] for n in sub.names()):
                    raise self.error(f"'{fname}' does not apply to {ltype} layers in layerforge", line, *where, fname)
            elif fname == "blobs":
                raise self.error("weights inside a net definition ('blobs') are not supported; load weights "
                                 "with net.copy_from", line, *where, fname)
            else:
                raise self.error(f"Caffe field '{fname}' has no layerforge equivalent", line, *where, fname)
        for extra in moved:
            transform = blocks.setdefault("transform", (_line_dict(extra.line), extra.line))[0]
            for key in extra:
                if key in transform:
                    raise self.error(f"'{key}' is given in both {extra.block}_param and transform_param",
                                     extra.line_of(key), *where, f"{extra.block}_param.{key}")
                _put(transform, key, extra[key], extra.line_of(key))
        if v1_params:
            _put(common, "param", self.v1_params(v1_params, where), min(e[0].line for e in v1_params.values()))
        out = _line_dict(msg.line)
        _put(out, "name", common.pop("name", name), common.line_of("name"))
        _put(out, "type", ltype, type_line)
        for key in LAYER_ORDER[2:]:
            if key in common:
                _put(out, key, common[key], common.line_of(key))
        for block in sorted(blocks, key=lambda b: (b != "transform", blocks[b][1])):
            _put(out, block, blocks[block][0], blocks[block][1])
        return out

    def split_moved(self, sub, block, moved, where):
        """Caffe's old data_param {scale, mean_file, crop_size, mirror} go to transform, as Caffe upgrades them."""
        if block not in ("data", "image_data", "window_data") or not any(n in sub for n in MOVED_TO_TRANSFORM):
            return sub
        kept, taken = Message(sub.line, sub.path), Message(sub.line, sub.path)
        for e in sub.entries:
            (taken if e.name in MOVED_TO_TRANSFORM else kept).entries.append(e)
        from ..data.transform import TRANSFORM
        extra = self.block(taken, TRANSFORM, "transform", where, f"{block}_param.")
        extra.block = block
        moved.append(extra)
        return kept

    def v1_params(self, found, where):
        names = [e.value for e in found.get("param", [])]
        lrs = [e.value for e in found.get("blobs_lr", [])]
        decays = [e.value for e in found.get("weight_decay", [])]
        for e in found.get("blob_share_mode", []):
            if e.value not in ("STRICT", 0):
                raise self.error(f"blob_share_mode {e.value} is not supported (layerforge shares strictly)",
                                 e.line, *where, "blob_share_mode")
        specs = []
        for i in range(max(len(names), len(lrs), len(decays))):
            spec = _line_dict()
            for key, values, src in (("name", names, "param"), ("lr_mult", lrs, "blobs_lr"),
                                     ("decay_mult", decays, "weight_decay")):
                if i < len(values):
                    _put(spec, key, values[i], found[src][i].line)
            spec.line = min(spec.key_lines.values())
            specs.append(spec)
        return _line_list(specs)

    def data_notes(self, net):
        data = [layer for layer in net["layers"] if layer["type"] in DATA_TYPES]
        blocks = ("data", "image_data", "hdf5_data", "window_data")
        sources = [b["source"] for layer in data for b in map(layer.get, blocks)
                   if isinstance(b, dict) and isinstance(b.get("source"), str)]
        missing = list(dict.fromkeys(s for s in sources if not os.path.exists(s)))
        if missing:
            self.notes.append("data sources are kept as written, relative to the directory layerforge runs in "
                              f"(point them at your data): {', '.join(missing)}")
        means = list(dict.fromkeys(m for layer in data for m in [(layer.get("transform") or {}).get("mean_file")]
                                   if isinstance(m, str) and not m.endswith((".npy", ".npz"))))
        if means:
            self.notes.append("mean files must be .npy/.npz images (layerforge compute_image_mean): "
                              + ", ".join(means))
        if any(layer["type"] == "Data" for layer in data):
            self.notes.append("layerforge's Data layer reshuffles every epoch in TRAIN (Caffe reads the database in "
                              "order); add 'shuffle: false' to its data block for Caffe's order")

    # ---------------------------------------------------------------------------------------------
    # solvers

    def solver(self, msg, rename_net=None):
        """SolverParameter -> layerforge solver mapping (validated).

        ``rename_net(old_path, key)`` gives the new value of each ``net`` / ``train_net`` / ``test_net`` path
        (default: the base name with ``.yaml``).
        """
        from ..solvers import SOLVER_KEYS, SOLVER_REGISTRY, load_solver_param
        rename_net = rename_net or (lambda old, key: default_net_name(old))
        out = _line_dict(msg.line)
        where = (None, None)
        for name in msg.names():
            entries = msg.all(name)
            line = entries[0].line
            if name in IGNORED["solver"]:
                continue
            if name in ("net_param", "train_net_param", "test_net_param"):
                nets = [self.net(e.value) for e in entries if self.is_message(e, name)]
                if name != "test_net_param":
                    self.singular(entries, where, name)
                _put(out, name, nets[0] if len(nets) == 1 else _line_list(nets, line), line)
            elif name in ("train_state", "test_state"):
                phase = "TRAIN" if name == "train_state" else "TEST"
                states = [self.net_state(e, phase) for e in entries if self.is_message(e, name)]
                if name == "train_state":
                    self.singular(entries, where, name)
                _put(out, name, states[0] if name == "train_state" else _line_list(states, line), line)
            elif name == "solver_type":
                self.singular(entries, where, name)
                value = str(entries[0].value).upper()
                if value not in SOLVER_TYPES:
                    raise self.error(f"unknown solver_type {entries[0].value}", line, key=name)
                if "type" in msg:
                    raise self.error("give 'type' or the deprecated 'solver_type', not both", line, key=name)
                _put(out, "type", SOLVER_TYPES[value], line)
            elif name in ("net", "train_net", "test_net"):
                value = self.value(entries, SOLVER_KEYS[name], name, where, name)
                renamed = [self.rename(v, name, rename_net) for v in _as_list(value, line)]
                _put(out, name, renamed[0] if name != "test_net" else _line_list(renamed, line), line)
            elif name in SOLVER_KEYS:
                _put(out, name, self.value(entries, SOLVER_KEYS[name], name, where, name), line)
            else:
                raise self.error(f"Caffe field '{name}' has no layerforge equivalent", line, key=name)
        if "base_lr" not in out:
            _put(out, "base_lr", 0.0, None)  # Caffe's default; layerforge's own default is 0.01
            self.notes.append("base_lr is not given: Caffe's default 0 is written out")
        if "snapshot_format" not in out:  # Caffe's default: .caffemodel + .solverstate, as Caffe's tools expect
            _put(out, "snapshot_format", "BINARYPROTO", None)
        try:
            load_solver_param(out, SOLVER_REGISTRY)
        except ConfigError as e:
            key = (e.key or "").split(".")[0]
            raise ConfigError(e.message, self.path, out.line_of(key) if key else out.line, key=e.key) from None
        return out

    def is_message(self, entry, name):
        if not isinstance(entry.value, Message):
            raise self.error(f"'{name}' must be a message {{ ... }}", entry.line, key=name)
        return True

    def net_state(self, entry, phase):
        state = entry.value
        for e in state.all("phase"):
            if str(e.value) != phase:
                raise self.error(f"a {phase.lower()} net's phase is {phase}, got {e.value}", e.line, key="phase")
        kept = Message(state.line, state.path)
        kept.entries = [e for e in state.entries if e.name != "phase"]
        from ..solvers.param import STATE
        return self.block(kept, STATE, "state", (None, None), "state.")

    def rename(self, old, key, rename_net):
        new = rename_net(old, key)
        if new != old:
            self.notes.append(f"{key}: '{old}' -> '{new}' (layerforge reads it relative to the solver YAML; "
                              "convert the Caffe net to that file)")
        return new


_INTS = Field("ints", [])
_BOOL = Field("bool", False)
_NET_STATE = {
    "phase": Field("enum", None, choices=("TRAIN", "TEST")),
    "level": Field("int", 0),
    "stage": Field("strs", []),
}


def _as_list(value, line):
    return value if isinstance(value, list) else _line_list([value], line)


def kind_of(msg):
    """``"net"`` or ``"solver"``: which message a parsed file holds."""
    from ..solvers import SOLVER_KEYS
    names = set(msg.names())
    if names & set(NET_FIELDS):
        return "net"
    if names & (set(SOLVER_KEYS) | {"solver_type"} | IGNORED["solver"]):
        return "solver"
    raise ConfigError("cannot tell whether this is a net (no 'layer' entries) or a solver (no solver fields)",
                      msg.path, msg.line)


def convert_message(msg, path=None, rename_net=None):
    """A parsed file -> ``(kind, mapping, notes)``."""
    conv = Converter(path)
    kind = kind_of(msg)
    mapping = conv.net(msg) if kind == "net" else conv.solver(msg, rename_net)
    return kind, mapping, conv.notes


def convert_file(path, rename_net=None):
    """Read a Caffe .prototxt (net or solver) -> ``(kind, mapping, notes)``; ConfigError on any problem."""
    return convert_message(parse_file(path), str(path), rename_net)


# -------------------------------------------------------------------------------------------------
# YAML output: block style for the file and the layer list, flow style for values that fit a line

WIDTH = 125
_PLAIN = re.compile(r"[A-Za-z_./][A-Za-z0-9_./\-]*")


def to_yaml(mapping, header=()):
    """The mapping as readable YAML text (layer order kept; short mappings in flow style)."""
    lines = [f"# {part}" for h in header for part in (textwrap.wrap(h, WIDTH - 2, subsequent_indent="  ") or [""])]
    _emit_mapping(mapping, 0, lines)
    return "\n".join(lines) + "\n"


def _emit_mapping(d, indent, lines):
    for key, value in d.items():
        prefix = " " * indent + f"{_scalar(key)}:"
        flow = _flow(value)
        long = len(prefix) + 1 + len(flow) > WIDTH
        if isinstance(value, dict) and value and long:
            lines.extend(_wrapped_flow(prefix, value))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value) and (
                long or key == "layers"):
            lines.append(prefix)
            for item in value:
                if key != "layers":
                    dash = " " * (indent + 2) + "-"
                    lines.extend(_wrapped_flow(dash, item) if item else [dash + " {}"])
                    continue
                sub = []
                _emit_mapping(item, indent + 4, sub)
                sub[0] = " " * (indent + 2) + "- " + sub[0].lstrip()
                lines.extend(sub)
        else:
            lines.append(f"{prefix} {flow}")


def _wrapped_flow(prefix, d):
    """A long flow mapping over several lines, continuations aligned after its ``{``."""
    items = [f"{_scalar(k)}: {_flow(v)}" for k, v in d.items()]
    lines, current = [], prefix + " {" + items[0]
    pad = " " * (len(prefix) + 2)
    for item in items[1:]:
        if len(current) + 2 + len(item) + 1 > WIDTH:
            lines.append(current + ",")
            current = pad + item
        else:
            current += ", " + item
    return lines + [current + "}"]


def _flow(value):
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_scalar(k)}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    return _scalar(value)


def _scalar(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        text = repr(value)
        if "e" in text and "." not in text.split("e")[0]:  # YAML 1.1 reads 5e-05 as a string, 5.0e-05 as a float
            mantissa, exponent = text.split("e")
            text = f"{mantissa}.0e{exponent}"
        return text
    text = str(value)
    if _PLAIN.fullmatch(text) and yaml.safe_load(text) == text:
        return text
    return _quoted(text)


def _quoted(text):
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif c.isprintable():
            out.append(c)
        else:
            code = ord(c)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return '"' + "".join(out) + '"'
