"""Layer definitions: one layer's mapping (YAML, or a converted Caffe prototxt) -> a validated LayerParameter.

Caffe's LayerParameter: ``name``, ``type``, ``bottom``, ``top``, ``param``, ``loss_weight``, ``propagate_down``,
``include``/``exclude`` rules (``LAYER_KEYS``), and the parameter blocks of the type (each layer class's
``param_blocks``), and what layers share to read their parameters against a bottom (:func:`canonical_axis`,
:func:`read_pair`). The net's own keys and the whole-net checks are in layerforge/net/netdef.py.
"""
from ..errors import ConfigError, ShapeError
from ..schema import Context, Field, LineDict, suggest, validate_block, with_lines
from .base import LAYER_REGISTRY

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


def parse_layer(mapping, path=None, index=0, registry=None, line=None):
    """Validate one layer mapping against the layer types of ``registry`` (default: every registered type) and
    return a LayerParameter (no arrays are created). ``line``: where the list has the item, for an item that
    is no mapping (and so knows no line of its own)."""
    registry = LAYER_REGISTRY if registry is None else registry
    mapping = with_lines(mapping)
    line = getattr(mapping, "line", None) or line
    if not isinstance(mapping, dict):
        what = "nothing (null)" if mapping is None else f"a {type(mapping).__name__}"
        raise ConfigError(f"layer #{index} must be a mapping, got {what}", path, line)
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


def canonical_axis(axis, ndim, key):
    """Caffe's CanonicalAxisIndex: -1 is the last axis; out of range is a ShapeError about ``key``."""
    if not -ndim <= axis < ndim:
        raise ShapeError(f"axis {axis} is out of range for a bottom with {ndim} axes", key=key)
    return axis % ndim


def read_pair(lp, block, name, default=None):
    """``(h, w)`` of a 2-D option written as ``name`` (one value or ``[h, w]``) or as ``<key>_h`` + ``<key>_w``.

    ``<key>`` is ``kernel`` for ``kernel_size``, else ``name``. ``default`` (None: required) applies when
    neither form is given. Raises the layer's ConfigError for mixed or incomplete forms, as Caffe does.
    """
    p = getattr(lp, block)
    key = "kernel" if name == "kernel_size" else name
    kh, kw = f"{key}_h", f"{key}_w"
    if p.given(kh) or p.given(kw):
        if p.given(name):
            raise lp.error(f"give either {name} or {kh}/{kw}, not both", f"{block}.{kh}")
        if not (p.given(kh) and p.given(kw)):
            raise lp.error(f"give both {kh} and {kw}", f"{block}.{kh if not p.given(kh) else kw}")
        return getattr(p, kh), getattr(p, kw)
    values = getattr(p, name)
    values = values if isinstance(values, list) else ([] if values is None else [values])
    if not values:
        if default is None:
            raise lp.error(f"required: {name}, or {kh} and {kw}", f"{block}.{name}")
        return default, default
    if len(values) > 2:
        raise lp.error(f"expected one value or [h, w] (2-D only), got {len(values)} values", f"{block}.{name}")
    return values[0], values[-1]
