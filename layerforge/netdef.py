"""Net definitions: YAML (or a dict) -> validated NetParameter and LayerParameters, before any array exists.

Caffe's NetParameter semantics: ``name``, ``input`` + ``input_shape`` (legacy inputs), ``force_backward``,
``state`` (the default NetState), ``layers`` (each with ``name``, ``type``, ``bottom``, ``top``, ``param``,
``loss_weight``, ``propagate_down``, ``include``/``exclude`` and the type's own parameter blocks), plus
layerforge's ``NET_OPTIONS``. docs/net-format.md describes the format with a full example.
"""
import os

from .blocks import annotate, expand_blocks
from .errors import ConfigError
from .schema import Context, Field, LineDict, LineList, load_config, suggest, validate_block, with_lines

PARAM_SPEC = {
    "name": Field("str", None, doc="share this parameter with every layer that uses the same name"),
    "lr_mult": Field("float", 1.0, doc="multiplies the solver's learning rate for this parameter"),
    "decay_mult": Field("float", 1.0, doc="multiplies the solver's weight decay for this parameter"),
}

STATE_RULE = {
    "phase": Field("enum", None, choices=("TRAIN", "TEST")),
    "min_level": Field("int", None),
    "max_level": Field("int", None),
    "stage": Field("strs", []),
    "not_stage": Field("strs", []),
}

LAYER_KEYS = {
    "name": Field("str", None),
    "type": Field("str", None),
    "bottom": Field("strs", []),
    "top": Field("strs", []),
    "param": Field([PARAM_SPEC], []),
    "loss_weight": Field("floats", []),
    "propagate_down": Field("bools", []),
    "include": Field([STATE_RULE], []),
    "exclude": Field([STATE_RULE], []),
}

NET_KEYS = ("name", "input", "input_shape", "input_dim", "force_backward", "state", "layers", "layer", "blocks",
            "unique_layer_names", "skip_undifferentiable", "fuse_batch_norm")

# layerforge's choices where Caffe's behaviour is a trap; each off by default, so a Caffe net runs as in Caffe
NET_OPTIONS = ("unique_layer_names", "skip_undifferentiable")
# optimisations that change no result beyond float rounding; each on by default (docs/net-format.md)
NET_OPTIMISATIONS = ("fuse_batch_norm",)


class LayerParameter:
    """A validated layer definition.

    Attributes: ``name``, ``type``, ``bottom``, ``top`` (lists of blob names), ``param`` (list of
    Params with name / lr_mult / decay_mult), ``loss_weight`` (list of floats), ``propagate_down``
    (list of bools), ``include``/``exclude`` (lists of rules), ``path``/``line`` (where it was
    written) and one attribute per parameter block of its type (``self.convolution`` ...).
    """

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def line_of(self, key):
        """The YAML line of ``key``; a dotted key (``convolution.group``) is followed into its block."""
        node, line = self.source, None
        for part in str(key).split("."):
            if not isinstance(node, LineDict):
                break
            line = node.line_of(part) if part in node else (line or node.line)
            node = node.get(part)
        return line

    @property
    def origin(self):
        """`` (in instance 'x' of block 'b', line n)`` for a layer made by a block, else an empty string."""
        return getattr(self.source, "origin", "") or ""

    def error(self, message, key=None):
        return ConfigError(message + self.origin, self.path, self.line_of(key) if key else self.line, self.name,
                           self.type, key)


def parse_layer(mapping, path=None, index=0, registry=None):
    """Validate one layer mapping and return a LayerParameter (no arrays are created)."""
    from .layers import LAYER_REGISTRY
    registry = LAYER_REGISTRY if registry is None else registry
    mapping = with_lines(mapping)
    line = getattr(mapping, "line", None)
    if not isinstance(mapping, dict):
        raise ConfigError(f"layer #{index} must be a mapping", path, line)
    name = mapping.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"layer #{index} has no 'name'", path, mapping.line_of("name") or line, key="name")
    ltype = mapping.get("type")
    if not isinstance(ltype, str):
        raise ConfigError("missing or non-string 'type'", path, mapping.line_of("type") or line, name, key="type")
    if ltype not in registry:
        raise ConfigError(f"unknown layer type '{ltype}'{suggest(ltype, registry)}",
                          path, mapping.line_of("type"), name, key="type")
    cls = registry[ltype]
    ctx = Context(path, name, ltype, line=mapping.line or line)
    for key in mapping:
        if key in LAYER_KEYS or key in cls.param_blocks:
            continue
        owners = sorted(t for t, c in registry.items() if key in c.param_blocks)
        if owners:
            msg = f"block '{key}' does not apply to {ltype} layers (it belongs to {', '.join(owners[:3])})"
        else:
            msg = f"unknown key{suggest(key, list(LAYER_KEYS) + list(cls.param_blocks))}"
        raise ctx.error(msg, key, mapping.line_of(key))
    common = validate_block(LineDict((k, v) for k, v in mapping.items() if k in LAYER_KEYS), LAYER_KEYS, ctx)
    if common.include and common.exclude:
        raise ctx.error("give either 'include' or 'exclude' rules, not both", "include", mapping.line_of("exclude"))
    if common.propagate_down and len(common.propagate_down) != len(common.bottom):
        raise ctx.error(f"has {len(common.propagate_down)} entries for {len(common.bottom)} bottoms",
                        "propagate_down", mapping.line_of("propagate_down"))
    blocks = {}
    for block, schema in cls.param_blocks.items():
        sub = mapping.get(block, LineDict())
        if not isinstance(sub, dict):
            raise ctx.error("expected a mapping of parameters", block, mapping.line_of(block))
        blocks[block] = validate_block(sub, schema, ctx.nested(block, mapping.line_of(block)))
    lp = LayerParameter(path=path, line=line, source=mapping, **common.as_dict(), **blocks)
    validate = getattr(cls, "validate_params", None)
    if validate is not None:
        validate(lp)
    return lp


def layer_included(lp, phase, level=0, stages=()):
    """Caffe's NetStateRule matching: any include rule must match, no exclude rule may."""

    def matches(rule):
        if rule.phase is not None and rule.phase != phase:
            return False
        if rule.min_level is not None and level < rule.min_level:
            return False
        if rule.max_level is not None and level > rule.max_level:
            return False
        if any(s not in stages for s in rule.stage):
            return False
        if any(s in stages for s in rule.not_stage):
            return False
        return True

    if lp.include:
        return any(matches(r) for r in lp.include)
    return not any(matches(r) for r in lp.exclude)


class NetParameter:
    """A validated net: ``name``, ``force_backward``, ``layers`` (LayerParameters), ``path``, ``state`` (the
    default phase / level / stage) and the options of ``NET_OPTIONS`` (docs/net-format.md)."""

    def __init__(self, name, layers, force_backward, path, state, unique_layer_names=False,
                 skip_undifferentiable=False, fuse_batch_norm=True):
        self.name, self.layers, self.force_backward, self.path, self.state = name, layers, force_backward, path, state
        self.unique_layer_names, self.skip_undifferentiable = unique_layer_names, skip_undifferentiable
        self.fuse_batch_norm = fuse_batch_norm


def load_net_def(source, path=None):
    """A path to a YAML file, or a dict -> NetParameter. Raises ConfigError on the first problem.

    ``path`` names the file a dict came from (a solver's inline ``net_param``), for error messages.
    """
    if isinstance(source, NetParameter):
        return source
    if isinstance(source, (str, os.PathLike)):
        path = str(source)
        mapping = load_config(path)  # YAML, or Caffe prototxt converted
    elif isinstance(source, dict):
        mapping = with_lines(source)
    else:
        raise TypeError(f"a net is a YAML path or a dict, not {type(source).__name__}")
    if not isinstance(mapping, dict):
        raise ConfigError("a net definition must be a mapping with a 'layers' list", path, getattr(mapping, "line", 1))
    mapping = expand_blocks(mapping, path)  # reusable blocks (layerforge/blocks.py) -> flat layers
    for key in mapping:
        if key not in NET_KEYS:
            raise ConfigError(f"unknown top-level key '{key}'{suggest(key, NET_KEYS)}", path, mapping.line_of(key), key=key)
    if "layers" in mapping and "layer" in mapping:
        raise ConfigError("give 'layers' or 'layer', not both", path, mapping.line_of("layer"), key="layer")
    raw_layers = mapping.get("layers", mapping.get("layer", LineList()))
    if not isinstance(raw_layers, list):
        raise ConfigError("'layers' must be a list", path, mapping.line_of("layers"), key="layers")
    name = mapping.get("name", "net")
    flags = {}
    for key in ("force_backward",) + NET_OPTIONS + NET_OPTIMISATIONS:
        flags[key] = mapping.get(key, key in NET_OPTIMISATIONS)
        if not isinstance(flags[key], bool):
            raise ConfigError("expected true or false", path, mapping.line_of(key), key=key)
    try:
        layers = _legacy_inputs(mapping, path) + [parse_layer(m, path, i) for i, m in enumerate(raw_layers)]
    except ConfigError as e:
        raise annotate(e, raw_layers) from None  # names the block instance a bad layer came from
    state = validate_block(mapping.get("state", LineDict()),
                           {"phase": Field("enum", None, choices=("TRAIN", "TEST")), "level": Field("int", 0),
                            "stage": Field("strs", [])}, Context(path, prefix="state."))
    return NetParameter(name, layers, flags.pop("force_backward"), path, state, **flags)


def _legacy_inputs(mapping, path):
    # Caffe's net-level `input: [data]` + `input_shape: [{dim: [...]}]` (or input_dim) become one Input layer
    if "input" not in mapping:
        return []
    names = mapping["input"] if isinstance(mapping["input"], list) else [mapping["input"]]
    if "input_shape" in mapping:
        shapes = mapping["input_shape"]
        shape_key = "input_shape"
    elif "input_dim" in mapping:
        dims = mapping["input_dim"]
        if not isinstance(dims, list) or len(dims) != 4 * len(names):
            raise ConfigError("input_dim needs 4 numbers per input", path, mapping.line_of("input_dim"), key="input_dim")
        shapes = [dims[4 * i:4 * i + 4] for i in range(len(names))]
        shape_key = "input_dim"
    else:
        raise ConfigError("'input' needs 'input_shape'", path, mapping.line_of("input"), key="input")
    layer = LineDict(name="input", type="Input", top=LineList(names), input=LineDict(shape=shapes))
    layer.line = mapping.line_of(shape_key)
    layer.key_lines = {"input": layer.line, "top": mapping.line_of("input")}
    return [parse_layer(layer, path)]


# parameter blocks of the data layers: their batch_size and (where they shard) rank / world_size
DATA_BLOCKS = ("data", "image_data", "hdf5_data", "window_data", "memory_data", "token_data")


def set_batch_size(netdef, batch):
    """Change the batch size of every Input, DummyData and data layer of a NetParameter (in place)."""
    for lp in netdef.layers:
        if lp.type == "Input":
            lp.input.shape = [(batch,) + tuple(s[1:]) for s in lp.input.shape]
        elif lp.type == "DummyData":
            lp.dummy_data.shape = [(batch,) + tuple(s[1:]) for s in lp.dummy_data.shape]
        else:
            for block in DATA_BLOCKS:
                p = getattr(lp, block, None)
                if p is not None and hasattr(p, "batch_size"):
                    p.batch_size = batch
    return netdef


def set_shard(netdef, rank, world_size):
    """Make every data layer of a NetParameter read shard ``rank`` of ``world_size`` (in place)."""
    for lp in netdef.layers:
        for block in DATA_BLOCKS:
            p = getattr(lp, block, None)
            if p is not None and hasattr(p, "world_size"):
                p.rank, p.world_size = int(rank), int(world_size)
    return netdef
