"""layerforge's YAML as a person would write it: block style for the file and the layer list, flow style for
values that fit a line. ``layerforge convert`` and pycaffe's ``NetSpec.to_yaml`` write their output with it."""
import math
import re
import textwrap

import yaml

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
