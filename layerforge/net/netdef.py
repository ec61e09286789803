"""Net definitions: YAML (or a dict) -> validated NetParameter and LayerParameters, before any array exists.

Caffe's NetParameter semantics: ``name``, ``input`` + ``input_shape`` (legacy inputs), ``force_backward``,
``state`` (the default NetState), ``layers`` (each with ``name``, ``type``, ``bottom``, ``top``, ``param``,
``loss_weight``, ``propagate_down``, ``include``/``exclude`` and the type's own parameter blocks), plus
layerforge's ``NET_OPTIONS``. docs/net-format.md describes the format with a full example.
"""
import os

from ..errors import ConfigError
from ..layers.layer_param import parse_layer
from ..schema import Context, Field, LineDict, LineList, suggest, validate_block, with_lines, wrong_kind_of_file
from .blocks import annotate, expand_blocks
from .caffe_net import read_net_file

NET_KEYS = ("name", "input", "input_shape", "input_dim", "force_backward", "state", "layers", "layer", "blocks",
            "unique_layer_names", "skip_undifferentiable", "fuse_batch_norm")

# layerforge's choices where Caffe's behaviour is a trap; each off by default, so a Caffe net runs as in Caffe
NET_OPTIONS = ("unique_layer_names", "skip_undifferentiable")
# optimisations that change no result beyond float rounding; each on by default (docs/net-format.md)
NET_OPTIMISATIONS = ("fuse_batch_norm",)


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
        mapping = read_net_file(path)  # YAML, or a Caffe prototxt net converted
    elif isinstance(source, dict):
        mapping = with_lines(source)
    else:
        raise TypeError(f"a net is a YAML path or a dict, not {type(source).__name__}")
    if not isinstance(mapping, dict):
        raise ConfigError("a net definition must be a mapping with a 'layers' list", path, getattr(mapping, "line", 1))
    mistaken = wrong_kind_of_file(mapping, path, "net")
    if mistaken is not None:
        raise mistaken
    mapping = expand_blocks(mapping, path)  # reusable blocks (layerforge/net/blocks.py) -> flat layers
    for key in mapping:
        if key not in NET_KEYS:
            raise ConfigError(f"unknown top-level key '{key}'{suggest(key, NET_KEYS)}", path, mapping.line_of(key), key=key)
    if "layers" in mapping and "layer" in mapping:
        raise ConfigError("give 'layers' or 'layer', not both", path, mapping.line_of("layer"), key="layer")
    raw_layers = mapping.get("layers", mapping.get("layer", LineList()))
    if not isinstance(raw_layers, list):
        raise ConfigError("'layers' must be a list", path, mapping.line_of("layers"), key="layers")
    name = mapping.get("name", "net")
    if not isinstance(name, str):
        raise ConfigError(f"expected a string, got {type(name).__name__}", path, mapping.line_of("name"), key="name")
    flags = {}
    for key in ("force_backward",) + NET_OPTIONS + NET_OPTIMISATIONS:
        flags[key] = mapping.get(key, key in NET_OPTIMISATIONS)
        if not isinstance(flags[key], bool):
            raise ConfigError("expected true or false", path, mapping.line_of(key), key=key)
    try:
        layers = _legacy_inputs(mapping, path) + [parse_layer(m, path, i, line=item_line(raw_layers, i))
                                                        for i, m in enumerate(raw_layers)]
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
DATA_BLOCKS = ("data", "image_data", "dense_image_data", "hdf5_data", "window_data", "memory_data", "token_data", "synthetic_data")


def _batch_holders(layers):
    """``(LayerParameter, block name, block, field)`` for every place ``layers`` give a batch size: the ``shape``
    list of Input and DummyData (the first axis of each shape), the ``batch_size`` of the data layers' blocks."""
    for lp in layers:
        if lp.type in ("Input", "DummyData"):
            name = "input" if lp.type == "Input" else "dummy_data"
            yield lp, name, getattr(lp, name), "shape"
        else:
            for name in DATA_BLOCKS:
                p = getattr(lp, name, None)
                if p is not None and hasattr(p, "batch_size"):
                    yield lp, name, p, "batch_size"


def set_batch_size(netdef, batch):
    """Change the batch size of every Input, DummyData and data layer of a NetParameter (in place)."""
    for _, _, p, field in _batch_holders(netdef.layers):
        if field == "shape":
            p.shape = [(batch,) + tuple(s[1:]) for s in p.shape]
        else:
            p.batch_size = batch
    return netdef


def batch_sizes(layers):
    """``[(LayerParameter, key, batch size), ...]`` of the Input, DummyData and data layers among ``layers``."""
    sizes = []
    for lp, name, p, field in _batch_holders(layers):
        if field == "shape":
            sizes += [(lp, f"{name}.shape", int(s[0])) for s in p.shape if len(s)]
        else:
            sizes.append((lp, f"{name}.batch_size", int(p.batch_size)))
    return sizes


def split_batch(layers, count):
    """Divide the batch size of the Input, DummyData and data layers among ``layers`` by ``count`` (in place):
    the batch of one of ``count`` replicas that together compute the whole. ConfigError (file, line, layer,
    key) where a batch does not divide."""
    for lp, key, size in batch_sizes(layers):
        if size % count:
            raise lp.error(f"batch size {size} does not split into {count} equal replica batches", key)
    for _, _, p, field in _batch_holders(layers):
        if field == "shape":
            p.shape = [(int(s[0]) // count,) + tuple(s[1:]) if len(s) else s for s in p.shape]
        else:
            p.batch_size //= count


def set_shard(netdef, rank, world_size):
    """Make every data layer of a NetParameter read shard ``rank`` of ``world_size`` (in place)."""
    for lp in netdef.layers:
        for block in DATA_BLOCKS:
            p = getattr(lp, block, None)
            if p is not None and hasattr(p, "world_size"):
                p.rank, p.world_size = int(rank), int(world_size)
    return netdef


def item_line(items, index):
    """The line of item ``index`` of a list read from YAML (the list's line, or None, when unknown)."""
    return items.line_of(index) if isinstance(items, LineList) else getattr(items, "line", None)
