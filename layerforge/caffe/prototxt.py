"""A parser for protobuf text format (Caffe's .prototxt files), without a schema.

Grammar (protobuf's TextFormat, as Caffe writes and reads it)::

    message  := field*
    field    := NAME ':'? '{' message '}'   |  NAME ':'? '<' message '>'
              | NAME ':' value              |  NAME ':' '[' value (',' value)* ']'
    value    := number | string+ | IDENTIFIER | '{' message '}'
    # comments run to the end of the line; ',' or ';' may follow any field

Without a schema, the parser cannot know which fields are repeated, so a :class:`Message` keeps every
occurrence in order (``msg.all("top")``) and each occurrence keeps its line. Values are ``int``,
``float`` (``inf``/``nan`` included), ``bool`` (``true``/``false``/``True``/``False``), ``str`` for quoted
strings (C escapes decoded, adjacent strings joined) and :class:`Enum` (a ``str``) for bare identifiers,
so ``pool: MAX`` and ``type: "xavier"`` stay distinguishable.
"""
import os
import re

from ..errors import ConfigError
from ..schema import load_yaml_text, read_config_text


class Enum(str):
    """A bare identifier value (``MAX``, ``TRAIN``): a protobuf enum constant."""

    def __repr__(self):
        return f"Enum({str(self)!r})"


class Entry:
    """One occurrence of a field: ``name``, ``value`` (a scalar or a :class:`Message`) and ``line``."""

    __slots__ = ("name", "value", "line")

    def __init__(self, name, value, line):
        self.name, self.value, self.line = name, value, line

    def __repr__(self):
        return f"Entry({self.name!r}, {self.value!r}, line={self.line})"


class Message:
    """A parsed message: its field occurrences in file order, the line it starts on and its file."""

    def __init__(self, line=1, path=None):
        self.entries, self.line, self.path = [], line, path

    def names(self):
        """Field names in order of first occurrence."""
        return list(dict.fromkeys(e.name for e in self.entries))

    def all(self, name):
        """Every occurrence of ``name`` (Entry objects), in order."""
        return [e for e in self.entries if e.name == name]

    def values(self, name):
        return [e.value for e in self.entries if e.name == name]

    def get(self, name, default=None):
        """The value of the last occurrence of ``name`` (protobuf's rule for singular fields)."""
        found = self.all(name)
        return found[-1].value if found else default

    def line_of(self, name):
        found = self.all(name)
        return found[0].line if found else self.line

    def __contains__(self, name):
        return any(e.name == name for e in self.entries)

    def to_dict(self):
        """Plain data: a field given once -> its value, given several times -> a list; messages -> dicts."""
        out = {}
        for name in self.names():
            vals = [v.to_dict() if isinstance(v, Message) else v for v in self.values(name)]
            out[name] = vals[0] if len(vals) == 1 else vals
        return out

    def __repr__(self):
        return f"Message(line={self.line}, {self.to_dict()!r})"


_TOKEN = re.compile(r"""
    (?P<space>[ \t\r\f\v]+|\#[^\n]*)
  | (?P<newline>\n)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<badstring>["'])
  | (?P<number>(?:0[xX][0-9a-fA-F]+|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fF]?)(?![A-Za-z0-9_.]))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<symbol>[{}<>\[\]:,;\-./])
""", re.VERBOSE)

_SIMPLE_ESCAPES = {"n": 10, "t": 9, "r": 13, "a": 7, "b": 8, "f": 12, "v": 11, "\\": 92, "'": 39, '"': 34, "?": 63}
_SPECIAL_FLOATS = {"inf": float("inf"), "infinity": float("inf"), "nan": float("nan")}
_BOOLS = {"true": True, "True": True, "false": False, "False": False}


MAX_DEPTH = 100  # messages inside messages: protobuf's own parsers stop at 100 (its default recursion limit)


class _Tokens:
    def __init__(self, text, path):
        self.path, self.items, self.depth = path, [], 0
        line, pos = 1, 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise ConfigError(f"invalid character {text[pos]!r}", path, line)
            kind = m.lastgroup
            if kind == "newline":
                line += 1
            elif kind == "badstring":
                raise ConfigError("string is not closed on its line", path, line)
            elif kind != "space":
                self.items.append((kind, m.group(), line))
            pos = m.end()
        # errors at the end of the file point at its last token, where the missing text belongs
        self.i, self.last_line = 0, self.items[-1][2] if self.items else line

    def peek(self, offset=0):
        j = self.i + offset
        return self.items[j] if j < len(self.items) else ("end", "end of file", self.last_line)

    def next(self):
        tok = self.peek()
        self.i += 1
        return tok

    def error(self, message, line=None):
        return ConfigError(message, self.path, self.peek()[2] if line is None else line)

    def expect(self, symbol, context):
        kind, text, line = self.next()
        if text != symbol or kind != "symbol":
            raise ConfigError(f"expected '{symbol}' {context}, got {_show(kind, text)}", self.path, line)


def _show(kind, text):
    return "end of file" if kind == "end" else repr(text)


def parse(text, path="<string>"):
    """Parse prototxt ``text`` into a :class:`Message`; syntax errors are ConfigErrors with ``path:line``."""
    tokens = _Tokens(text, path)
    msg = Message(1, path)
    _parse_fields(tokens, msg, closing=None)
    return msg


def parse_file(path):
    """Read and parse a .prototxt file."""
    return parse(read_config_text(path), str(path))


def _parse_fields(tokens, msg, closing):
    while True:
        kind, text, line = tokens.peek()
        if kind == "end":
            if closing is not None:
                raise ConfigError(f"message opened at line {msg.line} is not closed with '{closing}'",
                                  tokens.path, line)
            return
        if kind == "symbol" and text == closing:
            tokens.next()
            return
        if kind == "symbol" and text == "[":
            raise tokens.error("extension fields ('[name]') are not supported")
        if kind != "ident":
            raise tokens.error(f"expected a field name, got {_show(kind, text)}")
        tokens.next()
        _parse_field_value(tokens, msg, text, line)
        if tokens.peek()[1] in (",", ";") and tokens.peek()[0] == "symbol":
            tokens.next()


def _parse_field_value(tokens, msg, name, line):
    kind, text, _ = tokens.peek()
    colon = kind == "symbol" and text == ":"
    if colon:
        tokens.next()
        kind, text, _ = tokens.peek()
    if kind == "symbol" and text in ("{", "<"):
        msg.entries.append(Entry(name, _parse_message(tokens), line))
    elif not colon:
        raise tokens.error(f"expected ':' or '{{' after field '{name}', got {_show(kind, text)}")
    elif kind == "symbol" and text == "[":
        tokens.next()
        if tokens.peek()[1] == "]":
            tokens.next()
            return
        while True:
            value_line = tokens.peek()[2]
            if tokens.peek()[1] in ("{", "<"):
                value = _parse_message(tokens)
            else:
                value = _parse_scalar(tokens, name)
            msg.entries.append(Entry(name, value, value_line))
            kind, text, line2 = tokens.next()
            if text == "]":
                return
            if text != ",":
                raise ConfigError(f"expected ',' or ']' in the list of '{name}', got {_show(kind, text)}",
                                  tokens.path, line2)
    else:
        msg.entries.append(Entry(name, _parse_scalar(tokens, name), line))


def _parse_message(tokens):
    _, opening, line = tokens.next()
    if tokens.depth == MAX_DEPTH:
        raise ConfigError(f"messages nested more than {MAX_DEPTH} deep (protobuf's limit too)", tokens.path, line)
    tokens.depth += 1
    sub = Message(line, tokens.path)
    _parse_fields(tokens, sub, closing="}" if opening == "{" else ">")
    tokens.depth -= 1
    return sub


def _parse_scalar(tokens, name):
    kind, text, line = tokens.next()
    if kind == "string":
        parts = [_unescape(text, tokens.path, line)]
        while tokens.peek()[0] == "string":  # "abc" "def" is one string, as in C
            _, more, more_line = tokens.next()
            parts.append(_unescape(more, tokens.path, more_line))
        raw = b"".join(parts)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"string value of '{name}' is not valid UTF-8", tokens.path, line) from None
    negative = kind == "symbol" and text == "-"
    if negative:
        kind, text, line = tokens.next()
    if kind == "number":
        return -_number(text) if negative else _number(text)
    if kind == "ident":
        if text.lower() in _SPECIAL_FLOATS:
            value = _SPECIAL_FLOATS[text.lower()]
            return -value if negative else value
        if negative:
            raise ConfigError(f"expected a number after '-', got {text!r}", tokens.path, line)
        return _BOOLS.get(text, Enum(text))
    raise ConfigError(f"expected a value for '{name}', got {_show(kind, text)}", tokens.path, line)


def _number(text):
    if text[:2] in ("0x", "0X"):
        return int(text, 16)
    if text[-1] in "fF":
        return float(text[:-1])
    if any(c in text for c in ".eE"):
        return float(text)
    if len(text) > 1 and text[0] == "0":  # C-style octal, as protobuf's tokenizer reads it
        return int(text, 8)
    return int(text)


def _unescape(token, path, line):
    body, out, i = token[1:-1], bytearray(), 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out += c.encode("utf-8")
            i += 1
            continue
        e = body[i + 1]  # the tokenizer guarantees a character after a backslash
        if e in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[e])
            i += 2
        elif e in "01234567":
            digits = re.match(r"[0-7]{1,3}", body[i + 1:]).group()
            if int(digits, 8) > 255:
                raise ConfigError(f"octal escape \\{digits} is out of range", path, line)
            out.append(int(digits, 8))
            i += 1 + len(digits)
        elif e in "xX":
            digits = re.match(r"[0-9a-fA-F]{0,2}", body[i + 2:]).group()
            if not digits:
                raise ConfigError("\\x escape needs hexadecimal digits", path, line)
            out.append(int(digits, 16))
            i += 2 + len(digits)
        elif e in "uU":
            n = 4 if e == "u" else 8
            digits = body[i + 2:i + 2 + n]
            if not re.fullmatch(f"[0-9a-fA-F]{{{n}}}", digits) or int(digits, 16) > 0x10FFFF:
                raise ConfigError(f"\\{e} escape needs {n} hexadecimal digits", path, line)
            out += chr(int(digits, 16)).encode("utf-8", "surrogatepass")
            i += 2 + n
        else:
            raise ConfigError(f"invalid escape '\\{e}' in a string", path, line)
    return bytes(out)


_PROTOTXT_BLOCK = re.compile(r"^\s*[A-Za-z_]\w*\s*\{", re.M)


def is_prototxt(path, text):
    """True for Caffe's text format: a .prototxt/.pt file, or (any other name but .yaml/.yml) text with
    ``name {`` message blocks, which YAML never has at the start of a line. (Other files are read as YAML
    first: a prototxt of one ``key: value`` per line is valid YAML of the same meaning.)"""
    ext = os.path.splitext(str(path))[1].lower()
    if ext in (".yaml", ".yml"):
        return False
    return ext in (".prototxt", ".pt") or bool(_PROTOTXT_BLOCK.search(text))


def read_yaml_or_prototxt(path, convert):
    """A config file as LineDict values: YAML as it is, or Caffe prototxt parsed and given to ``convert``
    (``convert(message, path) -> mapping``). Either way, errors are one-line ConfigErrors naming file and line."""
    text = read_config_text(path)
    if is_prototxt(path, text):
        return convert(parse(text, str(path)), str(path))
    try:
        return load_yaml_text(text, str(path))
    except ConfigError as yaml_error:
        if os.path.splitext(str(path))[1].lower() in (".yaml", ".yml"):
            raise
        try:  # several "key: value" fields on one line are prototxt, never YAML
            return convert(parse(text, str(path)), str(path))
        except ConfigError:
            raise yaml_error from None
