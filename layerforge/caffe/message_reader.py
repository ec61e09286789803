"""A Caffe text-format message read against a layerforge schema.

The mapping is driven by layerforge's own schemas: a Caffe ``xxx_param`` message becomes the ``xxx`` block
of the layer type, and each of its fields must be a key of that block's schema (layerforge keeps Caffe's
names and defaults). A field that has no layerforge key is an error naming the field and its line, except
for the short lists below of fields that do not change results (``IGNORED``) or that are accepted only with
Caffe's default value (``DEFAULT_ONLY``). The mapping carries the prototxt's line numbers, so the loaders'
errors read ``NET.prototxt:LINE: layer ...: key ...``. What reads nets is layerforge/net/caffe_net.py, what
reads solvers layerforge/solvers/caffe_solver.py; docs/caffe-import.md is the user's reference.
"""
from ..errors import ConfigError
from ..schema import LineDict, LineList
from . import caffe_pb
from .prototxt import Message

# Fields dropped whatever their value: they choose an implementation or a file format, not a result.
IGNORED = {
    "*": {"engine"},                                     # CAFFE / CUDNN implementations compute the same function
    "net": {"debug_info"},                               # logging only
    "solver": {"debug_info", "snapshot_diff"},
}

# Fields accepted only with Caffe's default value (which is what layerforge does), rejected otherwise.
DEFAULT_ONLY = {
    "transform": {"force_color": False, "force_gray": False},
    "data": {"force_encoded_color": False},
    "param": {"share_mode": "STRICT"},
}


def line_dict(line=None):
    d = LineDict()
    d.line, d.key_lines = line, {}
    return d


def line_list(items, line=None):
    lst = LineList(items)
    lst.line = line
    return lst


def put(d, key, value, line):
    d[key] = value
    d.key_lines[key] = line


def shown(value):
    return "a message" if isinstance(value, Message) else repr(value) if isinstance(value, str) else str(value)


class MessageReader:
    """Reads messages of one parsed file; ``notes`` collects what the user should know (paths kept as written ...)."""

    def __init__(self, path=None):
        self.path, self.notes = path, []

    def error(self, message, line, layer=None, layer_type=None, key=None):
        return ConfigError(message, self.path, line, layer, layer_type, key)

    def block(self, msg, schema, scope, where=(None, None), prefix="", message=None):
        """``msg`` (a Message) -> LineDict of the keys of ``schema``; ``scope`` names the tables' entries and
        ``message`` the caffe_pb message it is (for the fork a field the schema lacks comes from)."""
        out = line_dict(msg.line)
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
                                     f"{shown(defaults[name])}, got {shown(bad[0].value)}", bad[0].line, *where, key)
                continue
            if name not in schema:
                raise self.no_equivalent(name, message, line, where, key)
            put(out, name, self.value(entries, schema[name], name, where, key, message), line)
        return out

    def no_equivalent(self, name, message, line, where=(None, None), key=None):
        """The error for Caffe field ``name`` of ``message`` (a caffe_pb message name) that layerforge lacks, naming
        the Caffe fork the field comes from when it is a fork's."""
        forks = caffe_pb.fork_of(message, name) if message else []
        origin = f" (a field of {caffe_pb.fork_names(forks)})" if forks else ""
        return self.error(f"Caffe field '{name}'{origin} has no layerforge equivalent", line, *where, key)

    def value(self, entries, field, name, where, key, message=None):
        kind = field.kind
        for e in entries:
            if isinstance(e.value, Message) != (isinstance(kind, (dict, list)) or kind in ("shapes", "dims")):
                what = "a message { ... }" if isinstance(e.value, Message) else f"the value {shown(e.value)}"
                raise self.error(f"Caffe field '{name}' cannot be {what} here", e.line, *where, key)
        sub = caffe_pb.field_type(message, name) if message else None
        if isinstance(kind, dict):
            self.singular(entries, where, key)
            return self.block(entries[0].value, kind, name, where, key + ".", sub)
        if isinstance(kind, list):
            items = [self.block(e.value, kind[0], name, where, key + ".", sub) for e in entries]
            return items[0] if len(items) == 1 and name != "param" else line_list(items, entries[0].line)
        if kind in ("shapes", "dims"):
            if kind == "dims":
                self.singular(entries, where, key)
            shapes = [self.shape(e, where, key) for e in entries]
            return shapes[0] if len(shapes) == 1 else line_list(shapes, entries[0].line)
        scalar = {"ints": "int", "floats": "float", "strs": "str", "bools": "bool"}.get(kind)
        if scalar is None:
            self.singular(entries, where, key)
            return self.scalar(entries[0].value, kind)
        items = [self.scalar(e.value, scalar) for e in entries]
        return items[0] if len(items) == 1 else line_list(items, entries[0].line)

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
        return line_list([self.scalar(v, "int") for v in msg.values("dim")], entry.line)

    @staticmethod
    def scalar(value, kind):
        if kind == "bool" and not isinstance(value, bool):
            # protobuf's text format also spells booleans t / f / 1 / 0
            return {"t": True, "f": False, 1: True, 0: False}.get(value, value)
        if kind in ("str", "enum") and isinstance(value, str):
            return str(value)
        return value

    def is_message(self, entry, name):
        if not isinstance(entry.value, Message):
            raise self.error(f"'{name}' must be a message {{ ... }}", entry.line, key=name)
        return True
