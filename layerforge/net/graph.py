"""The net's graph before any array exists (Caffe's Net::Init up to the layers' SetUp).

A name written by several layers (in place) has several *versions*; each bottom reads the latest version
written before it in the file (or, failing that, the last one: a bottom may refer to a later layer). From
these the layers are ordered (Kahn's algorithm, keeping the written order wherever the dependencies allow),
and a Split layer is inserted after every top that has several readers, as Caffe does.
"""
from ..layers import LAYER_REGISTRY
from ..layers.layer_param import LayerParameter
from ..schema import suggest

AUTOMATIC_TOP = "(automatic)"  # Caffe's name for the top a loss layer gets when it is written without one


class LayerEntry:
    """One layer of the net: its definition, its class, the blob versions it reads and writes (lists: inserting a
    Split re-points a reader's bottom) and the loss weight of each top; once the Net has built it, the Layer, the
    Blobs it reads and writes, and Caffe's backward flags (whether it runs backward, and which bottoms get a
    diff). The Net keeps one entry per layer, in execution order."""

    __slots__ = ("param", "cls", "bottoms", "tops", "loss_weights", "layer", "bottom_blobs", "top_blobs",
                 "need_backward", "bottom_need_backward")

    def __init__(self, param, cls, bottoms, tops, loss_weights):
        self.param, self.cls, self.bottoms, self.tops, self.loss_weights = param, cls, bottoms, tops, loss_weights
        self.layer = None
        self.bottom_blobs, self.top_blobs = [], []
        self.need_backward = False
        self.bottom_need_backward = []


class BlobVersion:
    """One value of a named blob: what produced it, who reads it, and whether it has a loss weight."""

    def __init__(self, name, producer, producer_name, top_index, is_split_output=False, anonymous=False):
        self.name, self.producer, self.producer_name, self.top_index = name, producer, producer_name, top_index
        self.is_split_output, self.anonymous = is_split_output, anonymous
        self.consumers = []  # (layer index, bottom index)
        self.blob = None


def resolve_graph(lps, excluded, phase):
    """The included layers in execution order: ``[(LayerParameter, bottom versions, top versions)]``; a bottom
    nobody produces, a top produced twice (but in place) or a cycle is a ConfigError naming the layer."""
    latest = {}        # name -> version produced so far in list order
    final = {}         # name -> last version overall (for bottoms that refer to later layers)
    tops = []          # per layer: list of versions it produces
    producers = {}     # name -> first (non in-place) producing layer
    for i, lp in enumerate(lps):
        row = []
        for j, name in enumerate(lp.top):
            if name in lp.top[:j]:
                raise lp.error(f"top '{name}' is listed twice", "top")
            in_place = name in lp.bottom
            if not in_place and name in producers:
                other = lps[producers[name]]
                raise lp.error(f"top '{name}' is already produced by layer '{other.name}' (line {other.line}); "
                               "only an in-place layer (same name as bottom and top) may write it again", "top")
            if not in_place:
                producers[name] = i
            v = BlobVersion(name, i, lp.name, j)
            row.append(v)
            final[name] = v
        cls = LAYER_REGISTRY[lp.type]
        if cls.default_loss_weight and len(row) < cls.num_top[0]:
            # Caffe's AutoTopBlobs: a loss written without a top gets anonymous ones, which no layer may read
            row += [BlobVersion(AUTOMATIC_TOP, i, lp.name, j, anonymous=True) for j in range(len(row), cls.num_top[0])]
        tops.append(row)
    bottoms = []
    for i, lp in enumerate(lps):
        row = []
        for j, name in enumerate(lp.bottom):
            v = latest.get(name) or final.get(name)
            if v is None:
                hint = [e.name for e in excluded if name in e.top]
                if hint:
                    msg = f"bottom '{name}' is produced only by layer '{hint[0]}', which is not in phase {phase}"
                else:
                    msg = f"bottom '{name}' is not produced by any layer{suggest(name, list(final))}"
                raise lp.error(msg, "bottom")
            row.append(v)
        bottoms.append(row)
        for v in tops[i]:
            if not v.anonymous:
                latest[v.name] = v
    order = topological_order(lps, bottoms)
    return [(lps[i], bottoms[i], tops[i]) for i in order]


def topological_order(lps, bottoms):
    """Layer indices in an order where each layer runs after the producers of its bottoms."""
    # Kahn's algorithm that keeps the written order wherever the dependencies allow it
    # a layer that depends on itself (reads its own top) never becomes ready: reported as a cycle
    remaining = {i: {v.producer for v in row} for i, row in enumerate(bottoms)}
    done, order = set(), []
    while len(order) < len(lps):
        ready = [i for i in sorted(remaining) if remaining[i] <= done]
        if not ready:
            cycle = _find_cycle(remaining, done)
            lp = lps[cycle[0]]
            path = " -> ".join(f"'{lps[k].name}'" for k in cycle + [cycle[0]])
            raise lp.error(f"the layers form a cycle: {path}", "bottom")
        i = ready[0]
        order.append(i)
        done.add(i)
        del remaining[i]
    return order


def _find_cycle(remaining, done):
    start = min(remaining)
    seen, path, node = {}, [], start
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        node = min(d for d in remaining[node] if d not in done)
    return path[seen[node]:]


def insert_splits(entries):
    """Caffe's InsertSplits: after each top read by several layers (or by a layer and the loss), a Split layer
    whose outputs feed one reader each, so each reader's gradient is summed into the top's diff."""
    out = []
    for entry in entries:
        out.append(entry)
        lp, tvs, lw = entry.param, entry.tops, entry.loss_weights
        for j, v in enumerate(tvs):
            loss_reader = lw[j] != 0
            if len(v.consumers) + loss_reader <= 1:
                continue
            # Caffe's names: <blob>_<producer>_<top index>_split[_k]
            split_name = f"{v.name}_{lp.name}_{j}_split"
            n = len(v.consumers) + loss_reader
            split_tops = [f"{split_name}_{k}" for k in range(n)]
            split_lp = LayerParameter(
                name=split_name, type="Split", bottom=[v.name], top=split_tops, param=[], loss_weight=[],
                propagate_down=[], include=[], exclude=[], path=lp.path, line=lp.line, source=None)
            split_versions = [BlobVersion(t, None, split_name, k, is_split_output=True) for k, t in enumerate(split_tops)]
            weights = [0.0] * n
            if loss_reader:
                weights[0], lw[j] = lw[j], 0.0
            consumers, v.consumers = v.consumers, []
            for k, sv in enumerate(split_versions):
                c = consumers[k - loss_reader] if k >= loss_reader else None
                if c is not None:
                    layer_k, bottom_j = c
                    entries[layer_k].bottoms[bottom_j] = sv
                    sv.consumers.append(c)
            v.consumers.append(("split", 0))
            out.append(LayerEntry(split_lp, LAYER_REGISTRY["Split"], [v], split_versions, weights))
    return out
