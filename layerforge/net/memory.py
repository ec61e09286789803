"""Activation memory planning for one training iteration (forward, then backward in reverse).

Every blob's ``data`` and ``diff`` is a *unit* with a live interval on the iteration's timeline:
layer i's forward is step i and its backward step 2L - 1 - i. Data lives from its producer's forward
to the last step that reads it: a consumer's forward, or the backward of a layer whose
``backward_reads`` names it (the producer for ``"top"``, a consumer for ``"bottom"``). A diff lives from
the first backward that writes it to its producer's backward. Units whose intervals do not overlap
share storage: a greedy pass (by birth, best fit) assigns each unit to a slot of a per-net pool, and
the blob's array becomes a view of its slot. So activations that no backward reads (a convolution's
output under max pooling, a pooling output under an in-place ReLU's top-reading backward...) are
given back after their last forward reader, and their memory holds later activations and diffs.

Pinned (never shared, always readable): blobs produced by layers without bottoms (inputs, data),
net outputs (losses, accuracies), diffs that no consumer assigns, and the storage of Split tops
(which alias their bottom's data; and its diff, one unit, where the Split's consumers make its sum:
``Net._sums_by_consumers``). The price of reuse: after an iteration, intermediate blobs hold
whatever last used their slot, so only tools that need speed and memory (the solver's train net,
``layerforge time``) turn planning on, with ``Net.optimize_memory()``.

``memory_report`` counts bytes: planned (slots + pinned units), unplanned (every blob's own arrays),
parameters (data + diff), layer caches (pooling argmax, BatchNorm's saved normalised input, ...:
every array attribute of a layer, and the input tiles a Winograd convolution keeps from forward for its backward in a
training pass) and the convolution workspace arenas, which all layers share.
"""
import numpy

from ..kernels.workspace import arena_bytes


class _Unit:
    __slots__ = ("blob", "kind", "birth", "death", "pinned", "slot")

    def __init__(self, blob, kind):
        self.blob, self.kind = blob, kind
        self.birth, self.death, self.pinned, self.slot = None, None, False, None

    def touch(self, step):
        self.birth = step if self.birth is None else min(self.birth, step)
        self.death = step if self.death is None else max(self.death, step)

    @property
    def count(self):
        return int(numpy.prod(self.blob.shape, dtype=numpy.int64))


def _units(net):
    n = len(net.layers)
    fwd, bwd = (lambda i: i), (lambda i: 2 * n - 1 - i)
    alias = {}  # id(split top blob) -> its bottom blob: their data is one array
    diff_alias = {}  # the same for the diffs of the Splits whose consumers make the sum (Net._sums_by_consumers)
    for i, layer in enumerate(net.layers):
        if layer.type == "Split":
            for t in net.top_blobs(i):
                alias[id(t)] = net.bottom_blobs(i)[0]
                if i in net._split_sums:
                    diff_alias[id(t)] = net.bottom_blobs(i)[0]
    data, diff = {}, {}

    def unit(table, blob, kind):
        key = id(blob)
        if key not in table:
            table[key] = _Unit(blob, kind)
        return table[key]

    def data_unit(blob):
        return unit(data, alias.get(id(blob), blob), "data")

    def diff_unit(blob):
        return unit(diff, diff_alias.get(id(blob), blob), "diff")

    consumed, assigned = set(), set()
    for i, entry in enumerate(net.entries):
        need = entry.need_backward
        reads = entry.layer.backward_reads if need else ()
        bottoms, tops = entry.bottom_blobs, entry.top_blobs
        for j, b in enumerate(bottoms):
            consumed.add(id(b))
            u = data_unit(b)
            u.touch(fwd(i))
            if "bottom" in reads:
                u.touch(bwd(i))
            if need and entry.bottom_need_backward[j]:
                u = diff_unit(b)
                u.touch(bwd(i))
                assigned.add(id(u.blob))
        for j, t in enumerate(tops):
            u = data_unit(t)
            u.touch(fwd(i))
            if not bottoms:
                u.pinned = True
            if "top" in reads:
                u.touch(bwd(i))
            if need or entry.loss_weights[j]:
                diff_unit(t).touch(bwd(i))
                if entry.loss_weights[j]:
                    assigned.add(id(t))
    for i in range(n):
        for t in net.top_blobs(i):
            if id(t) not in consumed:  # outputs: the caller reads them after the pass
                data_unit(t).pinned = True
                if id(t) in diff:
                    diff[id(t)].pinned = True
    for name in net.inputs:
        b = net.blobs[name]
        data_unit(b).pinned = True
        if id(b) in diff:
            diff[id(b)].pinned = True
    for key, u in diff.items():
        if key not in assigned:
            u.pinned = True  # nobody assigns it: it must keep its (zero) contents rather than a slot's leftovers
    return list(data.values()) + list(diff.values())


def plan(net, forward_through=None):
    """Assign storage to ``net``'s blobs for reuse; returns ``{"slots": [...], "units": [...]}``.
    ``forward_through``: the pass has run the forwards of layers 0 .. that index (a top's shape changed there: an SSD
    detection output's count, a Filter's): the data that later layers still read keeps its values in the new
    storage."""
    units = [u for u in _units(net) if u.count > 0]
    alive = {} if forward_through is None else {
        id(u): u.blob.data for u in units
        if u.kind == "data" and u.birth <= forward_through < u.death and not u.pinned}
    slots = []  # [size (elements), free-from step]
    for u in sorted((u for u in units if not u.pinned), key=lambda u: (u.birth, -u.count)):
        free = [k for k, (size, until) in enumerate(slots) if until < u.birth]
        fitting = [k for k in free if slots[k][0] >= u.count]
        if fitting:
            k = min(fitting, key=lambda k: slots[k][0])
        elif free:
            k = max(free, key=lambda k: slots[k][0])  # grow the largest free slot
        else:
            k = len(slots)
            slots.append([0, -1])
        slots[k][0] = max(slots[k][0], u.count)
        slots[k][1] = u.death
        u.slot = k
    xp, dtype = net.xp, net.dtype
    arrays = [xp.empty(size, dtype=dtype) for size, _ in slots]
    for u in units:
        if u.slot is None:
            continue
        view = arrays[u.slot][:u.count].reshape(u.blob.shape)
        if id(u) in alive:  # (born by layer i, so of the shape it has now; old and new slots never overlap)
            view[...] = alive[id(u)]
        setattr(u.blob, u.kind, view)
    _reshare_splits(net)
    return {"slots": arrays, "units": units}


def _reshare_splits(net, diffs=True):
    for i, layer in enumerate(net.layers):
        if layer.type == "Split":  # the tops alias the bottom's (new) array, and its diff where the consumers sum
            bottom = net.bottom_blobs(i)[0]
            for t in net.top_blobs(i):
                t.share_data(bottom)
                if i in net._split_sums:  # (not ``diffs``: unplanned, each its own again)
                    t.diff = bottom.diff if diffs else net.xp.zeros(t.shape, dtype=net.dtype)


def layer_bytes(layer, workspace=True):
    """Bytes a layer holds outside its blobs: array attributes and what its engines keep for backward (caches), and
    (``workspace``) engine workspaces."""
    total = int(getattr(layer, "workspace_bytes", 0) or 0) if workspace else 0
    total += int(getattr(layer, "kept_bytes", 0) or 0)
    seen = set()
    for value in vars(layer).values():
        if hasattr(value, "nbytes") and hasattr(value, "shape") and id(value) not in seen:
            seen.add(id(value))
            total += int(value.nbytes)
    return total


def unplan(net, planned):
    """Give every planned unit its own zeroed array again (undoes :func:`plan`)."""
    for u in planned["units"]:
        if u.slot is not None:
            setattr(u.blob, u.kind, net.xp.zeros(u.blob.shape, dtype=net.dtype))
    _reshare_splits(net, diffs=False)


def memory_report(net):
    """Byte counts of ``net`` as it is now (see the module docstring)."""
    bases = {}
    for blob in net.blobs.values():
        for a in (blob.data, blob.diff):
            base = a if a.base is None else a.base
            bases[id(base)] = int(base.nbytes)
    split_tops = {id(t) for i, layer in enumerate(net.layers) if layer.type == "Split" for t in net.top_blobs(i)}
    blobs = {id(b): b for b in net.blobs.values()}
    unplanned = sum(int(b.diff.nbytes) + (0 if key in split_tops else int(b.data.nbytes)) for key, b in blobs.items())
    params = {id(b): b for blobs in net.params.values() for b in blobs}
    param_bytes = sum(int(b.data.nbytes + b.diff.nbytes) for b in params.values())
    layers = {layer.name: layer_bytes(layer) for layer in net.layers}
    caches = sum(layer_bytes(layer, workspace=False) for layer in net.layers)
    workspace = arena_bytes()  # shared by all layers (layerforge.kernels.workspace)
    activations = sum(bases.values())
    return {"activation_bytes": activations, "unplanned_activation_bytes": unplanned,
            "param_bytes": param_bytes, "cache_bytes": caches, "workspace_bytes": workspace,
            "layer_bytes": caches + workspace, "peak_bytes": activations + param_bytes + caches + workspace,
            "per_layer_bytes": layers}
