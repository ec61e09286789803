"""Declarative parameter schemas and a YAML loader that remembers line numbers.

A layer class declares its parameter blocks as ``{block_name: {key: Field}}``; ``validate_block``
checks a user's mapping against it (unknown keys with a suggestion, types, ranges, enum values) and
returns a :class:`Params` namespace with defaults filled in. Every error is a one-line
:class:`~layerforge.errors.ConfigError` naming file, line, layer and key.
"""
import difflib
import math
import numbers
import os
import re

import yaml
from numpy import bool_ as numpy_bool

from .errors import ConfigError

REQUIRED = object()


# ---------------------------------------------------------------------------------------------
# YAML with line numbers (safe_load semantics: only plain scalars, lists and mappings)

class LineDict(dict):
    """A dict from YAML that knows its own line (``.line``) and each key's line (``.key_lines``)."""

    line = None
    key_lines = None

    def line_of(self, key):
        return (self.key_lines or {}).get(key, self.line)


class LineList(list):
    """A list from YAML that knows its line (``.line``) and its items' (``.line_of(index)``)."""

    line = None
    item_lines = ()

    def line_of(self, index):
        """The line of item ``index`` (the list's own line when unknown)."""
        return self.item_lines[index] if 0 <= index < len(self.item_lines) else self.line


class _LineLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader, node):
    loader.deepest_line = node.start_mark.line + 1  # where a RecursionError of a deep document is reported
    loader.flatten_mapping(node)
    d = LineDict()
    d.line = node.start_mark.line + 1
    d.key_lines = {}
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            raise ConfigError("a mapping key must be a plain value, not a list or mapping",
                              getattr(loader, "path", None), key_node.start_mark.line + 1)
        key = loader.construct_object(key_node, deep=True)
        if key in d:
            raise ConfigError(f"duplicate key '{key}'", getattr(loader, "path", None), key_node.start_mark.line + 1)
        d[key] = loader.construct_object(value_node, deep=True)
        d.key_lines[key] = key_node.start_mark.line + 1
    return d


def _construct_sequence(loader, node):
    loader.deepest_line = node.start_mark.line + 1
    lst = LineList(loader.construct_object(child, deep=True) for child in node.value)
    lst.line = node.start_mark.line + 1
    lst.item_lines = [child.start_mark.line + 1 for child in node.value]
    return lst


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def read_config_text(path):
    """The text of a config file (UTF-8); unreadable files become one-line ConfigErrors naming the path."""
    try:
        with open(path, "r", encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"cannot read file: {e.strerror}", str(path)) from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"not a UTF-8 text file ({e.reason} at byte {e.start})", str(path)) from None


def load_yaml(path):
    """Read a YAML file into LineDict/LineList values; syntax errors become one-line ConfigErrors."""
    return load_yaml_text(read_config_text(path), str(path))


# A config that expands to more nodes than this is refused before it is built: aliases can make a
# 1 KB file stand for billions of values ("billion laughs"), which would hang every later walk over it.
MAX_YAML_NODES = 1_000_000


def _first_too_large(root):
    """The first node (children before parents) of ``root`` whose expansion, every alias expanded, passes
    MAX_YAML_NODES; None when ``root`` stays within it. Each shared node is sized once, so this takes time in
    the number of distinct nodes, not in their expansion."""
    sizes = {}
    stack = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        if isinstance(node, yaml.ScalarNode):
            sizes[id(node)] = 1
            continue
        children = [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else node.value
        if children_done:
            total = 1 + sum(sizes.get(id(c), 0) for c in children)
            if total > MAX_YAML_NODES:
                return node
            sizes[id(node)] = total
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
    return None


def load_yaml_text(text, path="<string>"):
    """Parse YAML text into LineDict/LineList values; every way the text can be bad is a one-line ConfigError."""
    loader = None
    try:
        loader = _LineLoader(text)  # the reader checks the characters here already
        loader.path = path
        node = loader.get_single_node()
        if node is None:
            return None
        too_large = _first_too_large(node)
        if too_large is not None:  # its line: where the aliases multiply past the bound
            raise ConfigError(f"the YAML expands to more than {MAX_YAML_NODES:,} values through its aliases "
                              f"(&name / *name); write the values out or use blocks", path,
                              too_large.start_mark.line + 1)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else None
        raise ConfigError(f"invalid YAML: {e.problem or e.context}", path, line) from None
    except yaml.reader.ReaderError as e:
        line = text[:e.position].count("\n") + 1 if isinstance(e.position, int) else None
        code = ord(e.character) if isinstance(e.character, str) else e.character
        raise ConfigError(f"invalid YAML: character #x{code:04x} is not allowed in a YAML file", path, line) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"invalid YAML: {str(e).splitlines()[0]}", path) from None
    except RecursionError:  # the line being read (composing) or the deepest node built (constructing)
        line = getattr(loader, "deepest_line", None) or (loader.line + 1 if loader is not None else None)
        raise ConfigError("invalid YAML: lists or mappings nested too deeply to read", path, line) from None
    finally:
        if loader is not None:
            loader.dispose()


def with_lines(obj):
    """Turn plain dicts/lists (from a Python caller) into LineDict/LineList without lines."""
    if isinstance(obj, dict) and not isinstance(obj, LineDict):
        d = LineDict((k, with_lines(v)) for k, v in obj.items())
        d.key_lines = {}
        return d
    if isinstance(obj, dict):
        for k in obj:
            obj[k] = with_lines(obj[k])
        return obj
    if isinstance(obj, (list, tuple)) and not isinstance(obj, LineList):
        return LineList(with_lines(v) for v in obj)
    return obj


def suggest(word, choices):
    """``"; did you mean 'x'?"`` for the nearest choice, or an empty string."""
    near = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean '{near[0]}'?" if near else ""


# ---------------------------------------------------------------------------------------------
# A net file or a solver file

# top-level keys that only a net file has, and keys that only a solver file has: a file given where the other kind is
# expected (`time --model` given the zoo's resnet50.yaml solver, `train --solver` given resnet50_net.yaml) is named as
# such in one line, not as its first unknown key
NET_FILE_KEYS = ("layers", "layer", "input", "input_shape", "input_dim", "blocks")
SOLVER_FILE_KEYS = ("net", "net_param", "train_net", "train_net_param", "test_net", "test_net_param", "base_lr",
                    "lr_policy", "max_iter", "test_iter", "test_interval", "snapshot_prefix", "solver_mode")


def wrong_kind_of_file(mapping, path, expected):
    """A ConfigError when the top-level ``mapping`` read from ``path`` is a solver where a net is ``expected``
    (``expected="net"``) or a net where a solver is (``"solver"``); None when it is not the other kind."""
    def has(keys):
        return [k for k in keys if k in mapping]

    if expected == "net":
        found = has(SOLVER_FILE_KEYS)
        if not found or has(("layers", "layer")):
            return None
        net = mapping.get("net")
        if isinstance(net, str) and path is not None and not os.path.isabs(net):
            net = os.path.join(os.path.dirname(path), net)
        instead = f"give its net file {net} here" if isinstance(net, str) else "give a net file here"
        return ConfigError(f"a solver file (it has {', '.join(repr(k) for k in found[:3])}), not a net: {instead} "
                           f"(a solver goes to train --solver or plan --solver)", path, mapping.line_of(found[0]))
    found = has(NET_FILE_KEYS)
    if not found or has(("net", "net_param", "train_net", "train_net_param")):
        return None
    solvers = solvers_naming(path) if path is not None else []
    instead = f", such as {solvers[0]}" if solvers else ""
    return ConfigError(f"a net file (it has {', '.join(repr(k) for k in found[:3])}), not a solver: give a solver "
                       f"file whose 'net' names it{instead} (a net goes to time --model or test --model)", path,
                       mapping.line_of(found[0]))


def solvers_naming(path):
    """The solver files (YAML or prototxt) beside the net file ``path`` whose ``net``, ``train_net`` or ``test_net``
    names it (the zoo's solvers; the SSD fork's solver.prototxt beside its train and test nets), by file name."""
    folder, name = os.path.split(path)
    pattern = re.compile(rf"^(train_|test_)?net:\s*['\"]?([^'\"\s]*/)?{re.escape(name)}['\"]?\s*(#.*)?$",
                         re.MULTILINE)
    found = []
    try:
        siblings = sorted(os.listdir(folder or "."))
    except OSError:
        return found
    for sibling in siblings:
        if sibling.endswith((".yaml", ".yml", ".prototxt")) and sibling != name:
            try:
                with open(os.path.join(folder, sibling), encoding="utf-8") as f:
                    if pattern.search(f.read()):
                        found.append(os.path.join(folder, sibling))
            except (OSError, UnicodeDecodeError):
                continue
    return found


# ---------------------------------------------------------------------------------------------
# Fields

class Params:
    """Validated parameters of one block, as attributes (``p.num_output``); ``p.given(key)`` tells user-set keys."""

    def __init__(self, values, given=()):
        self.__dict__.update(values)
        self._given = frozenset(given)

    def given(self, key):
        return key in self._given

    def as_dict(self):
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def __repr__(self):
        return f"Params({self.as_dict()})"


class Field:
    """One key of a parameter block.

    Args:
        kind: ``int``, ``float``, ``bool``, ``str``, ``enum``, ``ints`` (an int or a list of ints),
            ``floats``, ``strs``, ``bools``, ``dims`` (a list of ints that may be 0 or -1, or ``{dim: [...]}``),
            ``shapes`` (a shape or a list of shapes; a shape is a list of ints or
            ``{dim: [...]}``), a nested schema dict (a sub-block), or ``[schema]`` (a list of sub-blocks).
        default: value when the key is absent; ``REQUIRED`` makes it mandatory.
        choices: allowed values for ``enum`` (upper-case names; user input is matched case-insensitively).
        min, max: inclusive bounds for numbers (each element for lists).
        doc: one line for the docs.
        finite: False lets a ``float`` be inf or nan (a bound that may be open); numbers are finite otherwise.
    """

    def __init__(self, kind, default=None, choices=None, min=None, max=None, doc="", finite=True):
        self.kind, self.default, self.choices = kind, default, choices
        self.min, self.max, self.doc, self.finite = min, max, doc, finite


def _check_number(value, kind, field, err):
    # numbers.Real admits numpy scalars from a Python dict config; bool is an int subclass but never a number here
    if isinstance(value, (bool, numpy_bool)) or not isinstance(value, numbers.Real):
        err(f"expected {'an integer' if kind == 'int' else 'a number'}, got {_describe(value)}")
    if not math.isfinite(value):
        if kind == "int" or field.finite:
            err(f"expected a finite number, got {value}")
        return float(value)
    if kind == "int":
        if not isinstance(value, numbers.Integral):
            if not float(value).is_integer():
                err(f"expected an integer, got {value}")
        value = int(value)
    else:
        value = float(value)
    if field.min is not None and value < field.min:
        err(f"must be >= {field.min}, got {value}")
    if field.max is not None and value > field.max:
        err(f"must be <= {field.max}, got {value}")
    return value


def _describe(value):
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing"
    return f"{type(value).__name__} {value!r}"


def _convert(value, field, err, ctx):
    kind = field.kind
    if isinstance(kind, dict):
        if not isinstance(value, dict):
            err(f"expected a mapping, got {_describe(value)}")
        return validate_block(value, kind, ctx)
    if isinstance(kind, list):
        items = value if isinstance(value, list) else [value]
        out = []
        for item in items:
            if not isinstance(item, dict):
                err(f"expected a mapping or a list of mappings, got {_describe(item)}")
            out.append(validate_block(item, kind[0], ctx))
        return out
    if kind in ("int", "float"):
        return _check_number(value, kind, field, err)
    if kind == "bool":
        if isinstance(value, numpy_bool):
            value = bool(value)
        if not isinstance(value, bool):
            err(f"expected true or false, got {_describe(value)}")
        return value
    if kind == "str":
        if not isinstance(value, str):
            err(f"expected a string, got {_describe(value)}")
        return value
    if kind == "enum":
        if not isinstance(value, str) or value.upper() not in field.choices:
            err(f"expected one of {', '.join(field.choices)}, got {value!r}{suggest(str(value).upper(), field.choices)}")
        return value.upper()
    if kind in ("ints", "floats", "strs", "bools"):
        items = value if isinstance(value, list) else [value]
        scalar = {"ints": "int", "floats": "float", "strs": "str", "bools": "bool"}[kind]
        return [_convert(v, Field(scalar, min=field.min, max=field.max, finite=field.finite), err, ctx) for v in items]
    if kind == "shapes":
        return _convert_shapes(value, err)
    if kind == "dims":
        if isinstance(value, dict):
            if set(value) != {"dim"}:
                err(f"a shape mapping takes only 'dim', got {sorted(value)}")
            value = value["dim"]
        return _convert(value, Field("ints", min=field.min, max=field.max), err, ctx)
    raise AssertionError(f"unknown field kind {kind!r}")


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, numpy_bool))


def _convert_shapes(value, err):
    def one(shape):
        if isinstance(shape, dict):
            if set(shape) != {"dim"}:
                err(f"a shape mapping takes only 'dim', got {sorted(shape)}")
            shape = shape["dim"]
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            err(f"expected a shape (a list of non-negative integers), got {_describe(shape)}")
        return tuple(int(d) for d in shape)

    if isinstance(value, dict):
        return [one(value)]
    if not isinstance(value, list) or not value:
        err(f"expected a shape or a list of shapes, got {_describe(value)}")
    if all(_is_int(v) for v in value):
        return [one(value)]
    return [one(v) for v in value]


class Context:
    """Where a block sits: file, layer name and type, a key prefix (``convolution.``) and the line to name
    when a key has none of its own (a missing key: the line of the block, or of the layer)."""

    def __init__(self, path=None, layer=None, layer_type=None, prefix="", line=None):
        self.path, self.layer, self.layer_type, self.prefix, self.line = path, layer, layer_type, prefix, line

    def error(self, message, key=None, line=None):
        return ConfigError(message, self.path, self.line if line is None else line, self.layer, self.layer_type,
                           None if key is None else self.prefix + str(key))

    def nested(self, key, line=None):
        return Context(self.path, self.layer, self.layer_type, f"{self.prefix}{key}.",
                       self.line if line is None else line)


def validate_block(mapping, schema, ctx):
    """Check ``mapping`` against ``schema`` ({key: Field}) and return a :class:`Params`."""
    mapping = with_lines(mapping) if not isinstance(mapping, LineDict) else mapping
    for key in mapping:
        if key not in schema:
            raise ctx.error(f"unknown key{suggest(key, schema)}", key, mapping.line_of(key))
    values = {}
    for key, field in schema.items():
        line = mapping.line_of(key)

        def err(message, key=key, line=line):
            raise ctx.error(message, key, line)

        if key in mapping:
            values[key] = _convert(mapping[key], field, err, ctx.nested(key))
        elif field.default is REQUIRED:
            raise ctx.error("required key is missing", key, mapping.line)
        elif isinstance(field.kind, dict):
            values[key] = validate_block(LineDict(), field.kind, ctx.nested(key)) if field.default is None else field.default
        else:
            values[key] = list(field.default) if isinstance(field.default, (list, tuple)) else field.default
    return Params(values, given=[k for k in mapping])


# ---------------------------------------------------------------------------------------------
# Schemas shared by several layers

FILLER = {
    "type": Field("enum", "CONSTANT", choices=("CONSTANT", "UNIFORM", "GAUSSIAN", "XAVIER", "MSRA", "BILINEAR"),
                  doc="filler type"),
    "value": Field("float", 0.0, doc="CONSTANT: the value"),
    "min": Field("float", 0.0, doc="UNIFORM: lower bound"),
    "max": Field("float", 1.0, doc="UNIFORM: upper bound"),
    "mean": Field("float", 0.0, doc="GAUSSIAN: mean"),
    "std": Field("float", 1.0, min=0.0, doc="GAUSSIAN: standard deviation"),
    "sparse": Field("int", -1, doc="GAUSSIAN: expected non-zeros per output unit (-1: dense)"),
    "variance_norm": Field("enum", "FAN_IN", choices=("FAN_IN", "FAN_OUT", "AVERAGE"),
                           doc="XAVIER/MSRA: which fan normalises the variance"),
}

LOSS = {
    "ignore_label": Field("int", None, doc="label value that contributes neither loss nor gradient"),
    "normalization": Field("enum", "VALID", choices=("FULL", "VALID", "BATCH_SIZE", "NONE"),
                           doc="divide the summed loss by: all positions, non-ignored positions, the batch size, or 1"),
    "normalize": Field("bool", None, doc="legacy Caffe flag: true = VALID, false = BATCH_SIZE"),
}
