"""Caffe NetParameter messages (.prototxt nets, current and V1) -> layerforge net mappings, and net files read
in either format. layerforge/caffe/message_reader.py says how a message maps onto the schemas.
"""
import os

from ..caffe import caffe_pb
from ..caffe.message_reader import IGNORED, MessageReader, line_dict, line_list, put, shown
from ..caffe.prototxt import Entry, Enum, Message, read_yaml_or_prototxt
from ..data.transform import TRANSFORM
from ..errors import ConfigError
from ..layers import LAYER_REGISTRY
from ..layers.layer_param import LAYER_KEYS
from ..schema import Field

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

# Fields of widely used Caffe forks (and of the converters that write for them) whose meaning is unambiguous:
# block -> {fork field: (layerforge key, {field value: key value})}. OpenCV's Caffe importer reads them too.
FORK_FIELDS = {"pooling": {"ceil_mode": ("round_mode", {True: "CEIL", False: "FLOOR"})}}

NET_FIELDS = ("layer", "layers", "input", "input_shape", "input_dim", "force_backward", "state")
DATA_TYPES = ("Data", "ImageData", "DenseImageData", "HDF5Data", "WindowData", "AnnotatedData", "CPMData")
LAYER_ORDER = ("name", "type", "bottom", "top", "include", "exclude", "param", "loss_weight", "propagate_down")
_INTS = Field("ints", [])
_BOOL = Field("bool", False)
_NET_STATE = {
    "phase": Field("enum", None, choices=("TRAIN", "TEST")),
    "level": Field("int", 0),
    "stage": Field("strs", []),
}


def as_list(value, line):
    return value if isinstance(value, list) else line_list([value], line)


class NetConverter(MessageReader):
    """Converts the nets of one parsed file."""

    def net(self, msg):
        """NetParameter -> layerforge net mapping (validated by load_net_def, which reads it)."""
        out = line_dict(msg.line)
        if "layer" in msg and "layers" in msg:
            raise self.error("give 'layer' (current) or 'layers' (V1) entries, not both", msg.line_of("layers"))
        for name in msg.names():
            entries = msg.all(name)
            line = entries[0].line
            if name in IGNORED["net"] or name in ("layer", "layers"):
                continue
            if name == "name":
                put(out, "name", self.value(entries, LAYER_KEYS["name"], name, (None, None), name), line)
            elif name in ("input", "input_dim"):
                field = LAYER_KEYS["top"] if name == "input" else _INTS
                put(out, name, as_list(self.value(entries, field, name, (None, None), name), line), line)
            elif name == "input_shape":
                shapes = [self.shape(e, (None, None), name) for e in entries]
                put(out, name, line_list(shapes, line), line)
            elif name == "force_backward":
                put(out, name, self.value(entries, _BOOL, name, (None, None), name), line)
            elif name == "state":
                self.singular(entries, (None, None), name)
                put(out, name, self.block(entries[0].value, _NET_STATE, "state", (None, None), "state."), line)
            else:
                raise self.no_equivalent(name, "NetParameter", line, key=name)
        v1 = "layers" in msg
        layers = [self.layer(e.value, v1) for e in msg.all("layers" if v1 else "layer")]
        put(out, "layers", line_list(layers, msg.line_of("layers" if v1 else "layer")),
             msg.line_of("layers" if v1 else "layer"))
        self.data_notes(out)
        return out

    def layer(self, msg, v1):
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
            forks = caffe_pb.forks_of_layer_type(ltype)
            origin = f"a layer of {caffe_pb.fork_names(forks)} that layerforge lacks" if forks else \
                "layerforge has no such layer"
            raise self.error(f"unsupported layer type '{ltype}' ({origin})", type_line, name, ltype, "type")
        cls, where = LAYER_REGISTRY[ltype], (name, ltype)
        common, blocks, v1_params, moved = line_dict(msg.line), {}, {}, []
        for fname in msg.names():
            entries = msg.all(fname)
            line = entries[0].line
            if fname == "type":
                continue
            if v1 and fname in ("param", "blobs_lr", "weight_decay", "blob_share_mode"):
                v1_params[fname] = entries
            elif fname in LAYER_KEYS:
                put(common, fname, self.value(entries, LAYER_KEYS[fname], fname, where, fname), line)
            elif fname.endswith("_param"):
                self.singular(entries, where, fname)
                block = fname[:-len("_param")]
                sub = entries[0].value
                if not isinstance(sub, Message):
                    raise self.error(f"'{fname}' must be a message {{ ... }}", line, *where, fname)
                if block in cls.param_blocks:
                    sub = self.fork_fields(self.split_moved(sub, block, moved, where), block, where, fname + ".")
                    message = caffe_pb.field_type("LayerParameter", fname)
                    blocks[block] = (self.block(sub, cls.param_blocks[block], block, where, fname + ".", message),
                                     line)
                elif block == "transform" and ltype in TRANSFORM_IGNORED:
                    self.notes.append(f"line {line}: layer '{where[0]}' ({ltype}): transform_param dropped "
                                      f"({ltype} layers do not transform their data, in Caffe either)")
                elif any(n not in IGNORED["*"] for n in sub.names()):
                    raise self.error(f"'{fname}' does not apply to {ltype} layers in layerforge", line, *where, fname)
            elif fname == "blobs":
                raise self.error("weights inside a net definition ('blobs') are not supported; load weights "
                                 "with net.copy_from", line, *where, fname)
            else:
                raise self.no_equivalent(fname, "LayerParameter", line, where, fname)
        for extra in moved:
            transform = blocks.setdefault("transform", (line_dict(extra.line), extra.line))[0]
            for key in extra:
                if key in transform:
                    raise self.error(f"'{key}' is given in both {extra.block}_param and transform_param",
                                     extra.line_of(key), *where, f"{extra.block}_param.{key}")
                put(transform, key, extra[key], extra.line_of(key))
        if ltype in ("Data", "AnnotatedData", "CPMData") and "data" in blocks and "shuffle" not in blocks["data"][0]:
            put(blocks["data"][0], "shuffle", False, None)  # Caffe's data layers read their database in key order
        if v1_params:
            put(common, "param", self.v1_params(v1_params, where), min(e[0].line for e in v1_params.values()))
        out = line_dict(msg.line)
        put(out, "name", common.pop("name", name), common.line_of("name"))
        put(out, "type", ltype, type_line)
        for key in LAYER_ORDER[2:]:
            if key in common:
                put(out, key, common[key], common.line_of(key))
        for block in sorted(blocks, key=lambda b: (b != "transform", blocks[b][1])):
            put(out, block, blocks[block][0], blocks[block][1])
        return out

    def fork_fields(self, sub, block, where, prefix):
        """A fork's field (``FORK_FIELDS``) becomes the layerforge key of the same meaning, at the same line."""
        for name, (key, values) in FORK_FIELDS.get(block, {}).items():
            entries = sub.all(name)
            if not entries:
                continue
            self.singular(entries, where, prefix + name)
            if key in sub:
                raise self.error(f"give '{name}' (a Caffe fork's field) or '{key}', not both", sub.line_of(key),
                                 *where, prefix + key)
            value = self.scalar(entries[0].value, "bool")
            if not isinstance(value, bool):
                raise self.error(f"Caffe field '{name}' takes true or false, got {shown(entries[0].value)}",
                                 entries[0].line, *where, prefix + name)
            kept = Message(sub.line, sub.path)
            kept.entries = [Entry(key, Enum(values[value]), e.line) if e.name == name else e for e in sub.entries]
            sub = kept
        return sub

    def split_moved(self, sub, block, moved, where):
        """Caffe's old data_param {scale, mean_file, crop_size, mirror} go to transform, as Caffe upgrades them."""
        if block not in ("data", "image_data", "window_data") or not any(n in sub for n in MOVED_TO_TRANSFORM):
            return sub
        kept, taken = Message(sub.line, sub.path), Message(sub.line, sub.path)
        for e in sub.entries:
            (taken if e.name in MOVED_TO_TRANSFORM else kept).entries.append(e)
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
            spec = line_dict()
            for key, values, src in (("name", names, "param"), ("lr_mult", lrs, "blobs_lr"),
                                     ("decay_mult", decays, "weight_decay")):
                if i < len(values):
                    put(spec, key, values[i], found[src][i].line)
            spec.line = min(spec.key_lines.values())
            specs.append(spec)
        return line_list(specs)

    def data_notes(self, net):
        data = [layer for layer in net["layers"] if layer["type"] in DATA_TYPES]
        blocks = ("data", "image_data", "dense_image_data", "hdf5_data", "window_data")
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


def read_net_file(path):
    """A net file (YAML, or a Caffe prototxt net converted) -> its mapping, not yet validated (load_net_def does)."""

    def convert(msg, where):
        if not set(msg.names()) & set(NET_FIELDS):
            raise ConfigError("not a net: a Caffe net has 'layer' entries (a solver file goes to get_solver / "
                              "--solver)", where, msg.line)
        return NetConverter(where).net(msg)

    return read_yaml_or_prototxt(path, convert)
