"""Reusable blocks: define a parameterised group of layers once, instantiate it many times.

A net's top-level ``blocks:`` maps block names to definitions; an entry of ``layers:`` with a ``block:``
key is an instance. :func:`expand_blocks` turns a net mapping that uses blocks into the flat mapping
Caffe would see (a pure function on LineDict/LineList values; every expanded layer keeps the YAML line
it was written on, i.e. its line in the block definition). docs/blocks.md describes the syntax::

    blocks:
      conv_relu:
        params: {out: null, k: 3}          # defaults; null = the instance must give it
        layers:
          - {name: "${name}", type: Convolution, bottom: "${bottom}", top: "${name}",
             convolution: {num_output: "${out}", kernel_size: "${k}", pad: "${k // 2}"}}
          - {name: "${name}_relu", type: ReLU, bottom: "${name}", top: "${name}"}
    layers:
      - {name: data, type: Input, top: data, input: {shape: [1, 3, 32, 32]}}
      - {block: conv_relu, name: "conv${i}", repeat: 3, with: {out: 64}}   # conv1 -> conv2 -> conv3

Inside a block every string value may use ``${expr}``: ``expr`` is a parameter, one of the built-in
variables ``name`` (the instance's name), ``bottom`` (its input blob) and ``i`` (1-based index in a
repeat), or integer arithmetic on them (``+ - * // %``, parentheses; parsed with ``ast``, never
evaluated by Python). A string that is exactly one ``${expr}`` takes the value's own type (``"${k}"``
-> 3); ``$${`` writes a literal ``${``.
"""
import ast
import operator
import re

from ..errors import ConfigError
from ..schema import LineDict, LineList, suggest

BLOCK_KEYS = ("params", "layers", "top")
INSTANCE_KEYS = ("block", "name", "names", "bottom", "repeat", "with", "include", "exclude")
BUILTINS = ("name", "bottom", "i")
MAX_DEPTH = 16
# Bounds that keep every config's expansion to seconds and bounded memory, whatever its repeats and arithmetic.
MAX_LAYERS = 100_000
MAX_VALUE = 2 ** 62

_REF = re.compile(r"\$\$\{|\$\{([^}]*)\}")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


class _Where:
    """Names the instance being expanded, for error messages."""

    def __init__(self, path, instance=None, block=None, line=None, outer=None):
        self.path, self.instance, self.block, self.line, self.outer = path, instance, block, line, outer

    def describe(self):
        if self.instance is None:
            return ""
        text = f" (in instance '{self.instance}' of block '{self.block}', line {self.line})"
        return text + (self.outer.describe() if self.outer else "")

    def error(self, message, line=None, key=None):
        return ConfigError(message + self.describe(), self.path, line, key=key)


def uses_blocks(mapping):
    """True when a net mapping has a ``blocks:`` key or a ``block:`` entry among its layers."""
    layers = mapping.get("layers", mapping.get("layer"))
    return "blocks" in mapping or (isinstance(layers, list) and any(isinstance(m, dict) and "block" in m
                                                                   for m in layers))


def expand_blocks(mapping, path=None):
    """A net mapping with ``blocks:`` and block instances -> the flat net mapping (a new LineDict).

    Mappings without blocks are returned unchanged. Raises ConfigError naming the file, line and the
    instance (and block) an error occurred in.
    """
    if not isinstance(mapping, dict) or not uses_blocks(mapping):
        return mapping
    where = _Where(path)
    defs = mapping.get("blocks", LineDict())
    if not isinstance(defs, dict):
        raise where.error("'blocks' must be a mapping of block names to definitions", _line(mapping, "blocks"), "blocks")
    for bname, bdef in defs.items():
        _check_block(bname, bdef, defs, where)
    key = "layers" if "layers" in mapping else "layer"
    raw = mapping.get(key)
    if not isinstance(raw, list):
        return mapping  # netdef reports the missing or malformed list
    out = LineDict((k, v) for k, v in mapping.items() if k != "blocks")
    out.line, out.key_lines = mapping.line, dict(mapping.key_lines or {})
    layers = LineList(_expand_list(raw, defs, {}, where, depth=0, previous=None)[0])
    layers.line = raw.line
    out[key] = layers
    return out


def annotate(error, raw_layers):
    """Add ``(in instance 'x' of block 'b', line n)`` to a ConfigError about a layer that came from a block."""
    if not isinstance(error, ConfigError) or error.layer is None or "(in instance" in error.message:
        return error
    for m in raw_layers if isinstance(raw_layers, list) else ():
        if isinstance(m, dict) and m.get("name") == error.layer and getattr(m, "origin", None):
            return ConfigError(error.message + m.origin, error.path, error.line, error.layer, error.layer_type,
                               error.key)
    return error


def _line(node, key=None):
    if isinstance(node, LineDict):
        return node.line_of(key) if key is not None else node.line
    return getattr(node, "line", None)


def _check_block(bname, bdef, defs, where):
    line = _line(defs, bname)
    if not isinstance(bdef, dict):
        raise where.error(f"block '{bname}' must be a mapping with 'params' and 'layers'", line, f"blocks.{bname}")
    for k in bdef:
        if k not in BLOCK_KEYS:
            raise where.error(f"unknown key{suggest(k, BLOCK_KEYS)}", _line(bdef, k), f"blocks.{bname}.{k}")
    params = bdef.get("params", LineDict())
    if not isinstance(params, dict):
        raise where.error("expected a mapping of parameter names to defaults", _line(bdef, "params"),
                          f"blocks.{bname}.params")
    for p in params:
        if p in BUILTINS or not isinstance(p, str) or not p.isidentifier():
            raise where.error(f"'{p}' cannot be a parameter name (identifiers other than {', '.join(BUILTINS)})",
                              _line(params, p), f"blocks.{bname}.params")
    if not isinstance(bdef.get("layers"), list) or not bdef["layers"]:
        raise where.error(f"block '{bname}' needs a non-empty 'layers' list", _line(bdef, "layers") or line,
                          f"blocks.{bname}.layers")


def _expand_list(raw, defs, env, where, depth, previous):
    """Expand a list of layer mappings and instances; returns (layers, output blob of the last entry)."""
    out = []
    for entry in raw:
        if isinstance(entry, dict) and "block" in entry:
            layers, previous = _expand_instance(entry, defs, env, where, depth, previous)
            out.extend(layers)
        else:
            layer = _substitute(entry, env, where) if env else entry
            out.append(layer)
            top = layer.get("top") if isinstance(layer, dict) else None
            top = top[0] if isinstance(top, list) and top else top
            previous = top if isinstance(top, str) else previous
    return out, previous


def _expand_instance(entry, defs, env, where, depth, previous):
    line = _line(entry)
    for k in entry:
        if k not in INSTANCE_KEYS:
            raise where.error(f"unknown key in a block instance{suggest(k, INSTANCE_KEYS)}", _line(entry, k), k)
    bname = entry["block"]
    if not isinstance(bname, str) or bname not in defs:
        raise where.error(f"unknown block '{bname}'{suggest(bname, list(defs))}", _line(entry, "block"), "block")
    if depth >= MAX_DEPTH:
        raise where.error(f"blocks nest deeper than {MAX_DEPTH} levels (does block '{bname}' use itself?)", line, "block")
    bdef = defs[bname]
    names = _instance_names(entry, env, where)
    bottom = _substitute(entry.get("bottom", previous), env, where)
    if not isinstance(bottom, str):
        raise where.error("a block instance needs a 'bottom' blob (none given and no layer before it)",
                          _line(entry, "bottom") or line, "bottom")
    given = entry.get("with", LineDict())
    if not isinstance(given, dict):
        raise where.error("expected a mapping of block parameters", _line(entry, "with"), "with")
    declared = bdef.get("params", LineDict())
    for p in given:
        if p not in declared:
            raise where.error(f"block '{bname}' has no parameter '{p}'{suggest(p, list(declared))}",
                              _line(given, p), f"with.{p}")
    rules = [k for k in ("include", "exclude") if k in entry]
    layers = []
    for i, name in enumerate(names, start=1):
        inner = _Where(where.path, name, bname, line, where if where.instance else None)
        values = dict(env, i=i)
        local = {"name": name, "bottom": bottom, "i": i}
        for p, default in declared.items():
            value = _substitute(given[p], values, where) if p in given else default
            if value is None:
                raise inner.error(f"block parameter '{p}' has no default; give it in 'with'", _line(given) or line,
                                  f"with.{p}")
            local[p] = value
        expanded, top = _expand_list(bdef["layers"], defs, local, inner, depth + 1, bottom)
        if "top" in bdef:
            top = _substitute(bdef["top"], local, inner)
        for layer in expanded:
            if isinstance(layer, LineDict) and not getattr(layer, "origin", None):
                layer.origin = inner.describe()
            if rules and isinstance(layer, dict):
                if "include" in layer or "exclude" in layer:
                    raise inner.error("a layer of an instance with include/exclude rules cannot have its own",
                                      _line(layer, "include") or _line(layer, "exclude"), "include")
                for k in rules:
                    layer[k] = entry[k]
                    layer.key_lines[k] = _line(entry, k)
        layers.extend(expanded)
        if len(layers) > MAX_LAYERS:
            raise where.error(f"block '{bname}' expands to more than {MAX_LAYERS:,} layers", line, "repeat")
        bottom = top
    return layers, bottom


def _instance_names(entry, env, where):
    line = _line(entry)
    if "names" in entry:
        names = entry["names"]
        if "name" in entry or "repeat" in entry:
            raise where.error("give either 'names' (a list) or 'name' with an optional 'repeat'", line, "names")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise where.error("expected a non-empty list of instance names", _line(entry, "names"), "names")
        return [_substitute(n, env, where) for n in names]
    repeat = _substitute(entry.get("repeat", 1), env, where, _line(entry, "repeat"))
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise where.error(f"expected a positive integer, got {_short(repr(repeat))}", _line(entry, "repeat"), "repeat")
    if repeat > MAX_LAYERS:
        raise where.error(f"repeat {repeat} is more than the {MAX_LAYERS:,} layers a net may have",
                          _line(entry, "repeat"), "repeat")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise where.error("a block instance needs a 'name' (the prefix of its layers)", line, "name")
    if repeat > 1 and "${i}" not in name.replace(" ", ""):
        raise where.error(f"a repeated instance's name must contain ${{i}} to stay unique, got '{name}'",
                          _line(entry, "name"), "name")
    return [_substitute(name, dict(env, i=i), where) for i in range(1, repeat + 1)]


def _substitute(node, env, where, line=None):
    """Copy ``node`` with every ``${expr}`` in its strings replaced; LineDict/LineList lines are kept."""
    if isinstance(node, dict):
        out = LineDict()
        out.line, out.key_lines = _line(node), dict(getattr(node, "key_lines", None) or {})
        for k, v in node.items():
            out[k] = _substitute(v, env, where, _line(node, k))
        return out
    if isinstance(node, list):
        out = LineList(_substitute(v, env, where, line) for v in node)
        out.line = getattr(node, "line", line)
        return out
    if not isinstance(node, str) or "$" not in node:
        return node
    whole = _REF.fullmatch(node)
    if whole and whole.group(1) is not None:
        return _evaluate(whole.group(1), env, where, line)
    return _REF.sub(lambda m: "${" if m.group(1) is None else str(_evaluate(m.group(1), env, where, line)), node)


def _short(text, limit=60):
    """``text`` cut to ``limit`` characters, so an error line never echoes a whole huge expression or value."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _evaluate(expr, env, where, line):
    shown = _short(expr.strip())
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        raise where.error(f"cannot read '${{{shown}}}': expected a parameter or integer arithmetic", line) from None
    except (RecursionError, MemoryError):
        raise where.error(f"cannot read '${{{shown}}}': the expression is too deeply nested", line) from None

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise where.error(f"unknown parameter '{node.id}' in '${{{shown}}}'{suggest(node.id, list(env))}", line)
            return env[node.id]
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = _number(walk(node.operand))
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            a, b = _number(walk(node.left)), _number(walk(node.right))
            if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and b == 0:
                raise where.error(f"division by zero in '${{{shown}}}'", line)
            value = _OPS[type(node.op)](a, b)
            if abs(value) > MAX_VALUE:
                raise where.error(f"'${{{shown}}}' is larger than {MAX_VALUE} in magnitude", line)
            return value
        raise where.error(f"cannot evaluate '${{{shown}}}': only parameters, integers and + - * // % are allowed", line)

    def _number(value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise where.error(f"arithmetic in '${{{shown}}}' needs numbers, got {_short(repr(value))}", line)
        return value

    try:
        return walk(tree)
    except RecursionError:
        raise where.error(f"cannot evaluate '${{{shown}}}': the expression is too deeply nested", line) from None
