"""Net: builds the layer graph of a net definition and runs forward and backward over it (Caffe's Net).

Build steps, all before any array is allocated: filter layers by phase/level/stage, bind every bottom to
the blob *version* it reads (an in-place layer makes a new version of the same name), insert Split layers
where one version feeds several layers (their diffs are summed), and order the layers topologically.
Then layers are created and set up in that order, parameters are shared by name, and the backward-need
analysis decides which layers and bottoms take part in backward.
"""
import collections
import contextlib
import copy

import numpy

from .. import backend, trace
from . import fusion, graph, memory
from ..blob import Blob
from ..kernels import blas
from ..kernels.autotune import settle_apart
from ..kernels.threadpool import fill_zeros
from ..errors import ConfigError, DataError, LabelError, LayerforgeError, ShapeError
from ..layers import LAYER_REGISTRY
from ..layers.layer_param import layer_included
from .netdef import batch_sizes, load_net_def, set_shard, split_batch
from ..npz import load_npz, save_npz_atomic, shape_of
from ..schema import Params, suggest


class Net:
    """A net built from a YAML path or a dict, pycaffe style.

    Args:
        source: path of a net YAML file, or a dict of the same structure.
        phase: ``"train"`` or ``"test"`` (layers are filtered by their include/exclude rules); None: the
            net's own ``state: {phase}``, else train.
        level, stages: Caffe's NetState level and stages for the rules; None: the net's ``state``. Given
            stages are added to the state's, a given level replaces it (Caffe's Net(file, phase, level, stages)).
        dtype: ``"float32"`` (default) or ``"float64"`` for every blob and parameter.
        weights: optional ``.npz`` of weights to copy in (as :meth:`copy_from`).
        shard: ``(rank, world_size)``: data layers read only that shard of their source.
        split: ``(index, count)``: this net is replica ``index`` of ``count`` that together compute one batch,
            this one its samples ``index, index + count, ...`` (as the data layers' shards deal the records,
            ``shard=(index, count)``): the batch of every Input, DummyData and data layer is divided by ``count``,
            and layers drawing per-sample randomness draw for the whole batch and keep these samples' values
            (``Layer.batch_split``, ``rng.batch_draw``).

    Attributes:
        blobs: ordered ``{name: Blob}`` of every blob (``.data`` / ``.diff``, shape N x C x H x W ...).
        params: ordered ``{layer name: [Blob, ...]}`` for layers that have parameters.
        layers: the Layer objects in execution order (auto-inserted Split layers included).
        inputs / outputs: names of input blobs (tops of Input layers) and of blobs no layer consumes.
        loss: total weighted loss of the last forward pass (a float).
        phase, level, stages: the NetState the layers were selected with.
        entries: one :class:`~layerforge.net.graph.LayerEntry` per layer, in execution order: its definition, Layer,
            bottom and top blobs, loss weights and backward flags.
        layer_need_backward, bottom_need_backward: Caffe's backward flags, per layer (see :meth:`_analyse_backward`).

    The net's seam, through which data parallelism and pycaffe's callbacks act on it (nothing else changes a net
    from outside): :meth:`add_hooks` (per layer around forward and backward, and per pass) and
    :meth:`set_batch_group` (layers that compute over the batch of several replicas).
    """

    def __init__(self, source, phase=None, level=None, stages=None, dtype="float32", weights=None, xp=numpy,
                 shard=None, split=None):
        self.netdef = load_net_def(source)
        self.split = None if split is None or split[1] == 1 else (int(split[0]), int(split[1]))
        if self.split is not None:  # split on a copy: the caller's NetParameter may build the test nets too
            self.netdef = copy.deepcopy(self.netdef)
        if shard is not None:
            set_shard(self.netdef, *shard)
        self.path = self.netdef.path
        self.name = self.netdef.name
        # Caffe's NetState: the file's `state`, with phase and level replaced and stages added by the arguments
        state = self.netdef.state
        self.phase = str(phase if phase is not None else state.phase or "train").upper()
        if self.phase not in ("TRAIN", "TEST"):
            raise LayerforgeError(f"phase must be 'train' or 'test', got {phase!r}")
        self.level = int(level if level is not None else state.level)
        self.stages = tuple(state.stage) + tuple(s for s in (stages or ()) if s not in state.stage)
        self.dtype = backend.dtype_of(dtype)
        self.xp = xp
        self.loss = 0.0
        included = [lp for lp in self.netdef.layers if layer_included(lp, self.phase, self.level, self.stages)]
        excluded = [lp for lp in self.netdef.layers if lp not in included]
        if self.split is not None:
            split_batch(included, self.split[1])
        # Caffe allows a name on several layers of one net (its MNIST autoencoder has two "loss" layers):
        # looking a layer up by name finds the last one, as Caffe's layer_names_index_ does
        if self.netdef.unique_layer_names:
            seen = {}
            for lp in included:  # one name may still serve several phases (Caffe's two "mnist" data layers)
                if lp.name in seen:
                    raise lp.error(f"layer name '{lp.name}' is already used at line {seen[lp.name]}", "name")
                seen[lp.name] = lp.line
        self._memory_plan = None
        self._split_sums = {}  # under optimize_memory: the Splits whose consumers make the sum (_sums_by_consumers)
        self._auto_convolutions = None  # the layers AUTO chooses engines for (_settle_forward_apart)
        self._build(graph.resolve_graph(included, excluded, self.phase))
        if weights is not None:
            self.copy_from(weights)

    # ------------------------------------------------------------------------------------------
    # building layers and blobs

    def _build(self, resolved):
        # Count consumers of every version and the loss weight of every top.
        entries = []  # graph.LayerEntry per layer
        for lp, bottom_versions, top_versions in resolved:
            cls = LAYER_REGISTRY[lp.type]
            cls.check_blob_counts(lp, len(lp.bottom), len(top_versions))
            weights = list(lp.loss_weight)
            if weights and len(weights) != len(top_versions):
                raise lp.error(f"has {len(weights)} loss weights for {len(top_versions)} tops", "loss_weight")
            if not weights:
                weights = [cls.default_loss_weight if j == 0 else 0.0 for j in range(len(top_versions))]
            entries.append(graph.LayerEntry(lp, cls, list(bottom_versions), list(top_versions), weights))
        for k, entry in enumerate(entries):
            for j, v in enumerate(entry.bottoms):
                v.consumers.append((k, j))
        # one record per layer (graph.LayerEntry): its definition, Layer, blobs and backward flags
        self.entries = graph.insert_splits(entries)
        self.layers = []  # the entries' Layers, in order: the public list (pycaffe's net.layers)
        self.blobs = collections.OrderedDict()
        for entry in self.entries:
            lp = entry.param
            layer = entry.cls(lp, phase=self.phase, dtype=self.dtype, xp=self.xp)
            layer.batch_split = self.split
            bottom = [v.blob for v in entry.bottoms]
            top = []
            for v in entry.tops:
                source = entry.bottoms[lp.bottom.index(v.name)] if v.name in lp.bottom else None
                if source is not None and len(source.consumers) == 1 and not source.is_split_output:
                    v.blob = source.blob  # in place: same storage
                else:
                    v.blob = Blob((), self.dtype, self.xp)
                top.append(v.blob)
                self.blobs[v.name] = v.blob
            self._setup_layer(layer, bottom, top, entry.bottoms)
            entry.layer, entry.bottom_blobs, entry.top_blobs = layer, bottom, top
            self.layers.append(layer)
        self._share_params()
        self._analyse_backward()
        self._overwritten_diffs = self._whole_diff_writers()
        self.inputs = [v.name for e in self.entries if e.param.type == "Input" for v in e.tops]
        consumed = {id(v) for e in self.entries for v in e.bottoms}
        self.outputs = [v.name for e in self.entries for v in e.tops
                        if id(v) not in consumed and not v.anonymous and self.blobs[v.name] is v.blob]
        self._layer_index = {layer.name: i for i, layer in enumerate(self.layers)}
        # BatchNorm + Scale (+ ReLU) in place, and Eltwise SUM + ReLU, run as one (layerforge.net.fusion):
        # {member index: group}
        self._fused = {**fusion.eltwise_relu_groups(self),
                       **(fusion.batch_norm_groups(self) if self.netdef.fuse_batch_norm else {})}
        self._fused.update(fusion.residual_join_groups(self, self._fused))
        # convolutions that may keep what their forward derives from their bottom for their backward (training_pass):
        # one bottom, whose values no later layer writes (in place on it or on a Split's top), and a backward to run
        self._keeping = [i for i, layer in enumerate(self.layers) if layer.type == "Convolution"
                         and len(self.bottom_blobs(i)) == 1 and self.entries[i].need_backward
                         and not self._written_later(i, self.bottom_blobs(i)[0])]
        # the seam (add_hooks): fn(i) around layer i's forward and its step of backward, run or skipped (Caffe's
        # Net callbacks; backward_hooks are after_backward's, e.g. to send gradients that are final), and
        # fn(direction, finished) around a whole forward or backward pass
        self.before_forward_hooks, self.after_forward_hooks = [], []
        self.before_backward_hooks, self.backward_hooks = [], []
        self.pass_hooks = []

    def _setup_layer(self, layer, bottom, top, bottom_versions):
        lp = layer.layer_param
        try:
            layer.setup(bottom, top)
        except DataError as e:  # a data source or transform problem: say which file and layer asked for it
            if lp.path is None or str(e).startswith(str(lp.path)):
                raise
            raise DataError(f"{lp.path}:{lp.line}: {e}") from None
        except ShapeError as e:
            inputs = ", ".join(
                f"'{v.name}' {tuple(b.shape)} from layer '{v.producer_name}'" for v, b in zip(bottom_versions, bottom))
            where = f" (bottoms: {inputs})" if inputs else ""
            raise ConfigError(e.message + where + lp.origin, lp.path, lp.line_of(e.key.split(".")[0]) if e.key else lp.line,
                              lp.name, lp.type, e.key) from None

    def _share_params(self):
        owners = {}  # param name -> (layer index, param index, spec)
        self.learnable_params, self.params_lr, self.params_weight_decay = [], [], []
        self.params = collections.OrderedDict()
        for i, entry in enumerate(self.entries):
            layer, lp = entry.layer, entry.param
            if len(lp.param) > len(layer.blobs):
                raise lp.error(f"has {len(lp.param)} 'param' entries but {lp.type} has {len(layer.blobs)} parameter blob(s)",
                               "param")
            for j, blob in enumerate(layer.blobs):
                spec = lp.param[j] if j < len(lp.param) else Params({"name": None, "lr_mult": 1.0, "decay_mult": 1.0})
                if not layer.learnable:
                    spec = Params({"name": spec.name, "lr_mult": 0.0, "decay_mult": 0.0})
                if spec.name and spec.name in owners:
                    oi, oj, ospec = owners[spec.name]
                    owner_blob = self.layers[oi].blobs[oj]
                    if tuple(owner_blob.shape) != tuple(blob.shape):
                        raise lp.error(f"shared parameter '{spec.name}' has shape {tuple(blob.shape)} here but "
                                       f"{tuple(owner_blob.shape)} in layer '{self.layers[oi].name}'", "param")
                    for key in ("lr_mult", "decay_mult"):
                        if spec.given(key) and getattr(spec, key) != getattr(ospec, key):
                            raise lp.error(f"shared parameter '{spec.name}' sets {key} {getattr(spec, key)} but its "
                                           f"owner '{self.layers[oi].name}' has {getattr(ospec, key)}", "param")
                    layer.blobs[j] = owner_blob
                    continue
                if spec.name:
                    owners[spec.name] = (i, j, spec)
                self.learnable_params.append(blob)
                self.params_lr.append(spec.lr_mult)
                self.params_weight_decay.append(spec.decay_mult)
            if layer.blobs:
                self.params[layer.name] = layer.blobs  # a repeated name shows its last layer, as in pycaffe
        for name, blobs in self.param_keys():
            for j, blob in enumerate(blobs):
                blob.name = blob.name or f"layer '{name}' parameter {j}"
        learnable_ids = {id(b) for layer in self.layers if layer.learnable for b in layer.blobs}
        self.num_learnable = sum(b.count for b in self.learnable_params if id(b) in learnable_ids)

    def _analyse_backward(self):
        """Caffe's Net::Init backward analysis, flag for flag (test_net.cpp's Bottom/Skip/ForcePropagateDown).

        Forward: a parameter takes a gradient when its layer's own ``param`` entry has lr_mult != 0
        (``layer.param_propagate_down``); a layer needs backward when some bottom's blob or some parameter does;
        a bottom gets a diff when its blob needs one, or exactly as ``propagate_down`` says when given (true
        forces it). Backward: layers and bottoms under no loss, and layers whose every top is skipped, are
        dropped. ``force_backward`` then adds every bottom the layer allows and every parameter. Layers without
        a backward (ArgMax, Threshold...) and loss labels are asked like any other, and stop backward with an
        error, as in Caffe, unless the net sets ``skip_undifferentiable``.
        """
        skip_undiff = self.netdef.skip_undifferentiable
        need = {}  # id(version) -> Caffe's blob_need_backward
        for entry in self.entries:
            layer, lp, bvs = entry.layer, entry.param, entry.bottoms
            given = lp.propagate_down
            row = [bool(given[j]) if given else need.get(id(v), False) for j, v in enumerate(bvs)]
            if skip_undiff and not given:
                row = [r and layer.has_backward and layer.allow_force_backward(j) for j, r in enumerate(row)]
            layer.param_propagate_down = [
                layer.learnable and (lp.param[j].lr_mult if j < len(lp.param) else 1.0) != 0
                for j in range(len(layer.blobs))]
            layer_need = any(need.get(id(v), False) for v in bvs) or any(layer.param_propagate_down)
            if skip_undiff:
                layer_need = layer_need and layer.has_backward
            for v in entry.tops:
                need[id(v)] = layer_need
            entry.need_backward, entry.bottom_need_backward = layer_need, row
        under_loss, skip = set(), set()
        for entry in reversed(self.entries):
            bvs, tvs, lw = entry.bottoms, entry.tops, entry.loss_weights
            contributes = any(lw[j] != 0 or id(v) in under_loss for j, v in enumerate(tvs))
            skip_propagate = all(id(v) in skip for v in tvs)
            if entry.need_backward and skip_propagate:
                entry.need_backward = False
                entry.bottom_need_backward = [False] * len(bvs)
            if not contributes:
                entry.need_backward = False
            for j, v in enumerate(bvs):
                if contributes:
                    under_loss.add(id(v))
                else:
                    entry.bottom_need_backward[j] = False
                if not entry.bottom_need_backward[j]:
                    skip.add(id(v))
        if self.netdef.force_backward:
            for entry in self.entries:
                layer = entry.layer
                if not layer.has_backward:
                    continue  # Caffe would ask them too, and stop (a net with an Accuracy layer could not run)
                entry.need_backward = True
                entry.bottom_need_backward = [
                    r or layer.allow_force_backward(j) for j, r in enumerate(entry.bottom_need_backward)]
                layer.param_propagate_down = [True] * len(layer.blobs)

    @property
    def layer_need_backward(self):
        """Per layer: whether it runs backward (Caffe's layer_need_backward)."""
        return [e.need_backward for e in self.entries]

    @property
    def bottom_need_backward(self):
        """Per layer: per bottom, whether it gets a diff (Caffe's bottom_need_backward)."""
        return [e.bottom_need_backward for e in self.entries]

    # ------------------------------------------------------------------------------------------
    # the seam: what data parallelism and pycaffe's callbacks ask of a net

    def add_hooks(self, before_forward=None, after_forward=None, before_backward=None, after_backward=None,
                  passes=None):
        """Call ``fn(i)`` before or after layer ``i``'s forward, before or after its step of backward (which runs
        for every layer of the range, whether it takes part in backward or not); ``passes(direction, finished)``
        at the start (``finished`` False) and the end of every forward and backward pass (``direction``
        ``"forward"`` or ``"backward"``). Hooks of one kind run in the order they were added (Caffe's
        Net::add_before_forward ...; the solver's seams with ``layer_hooks`` are after_backward hooks)."""
        for hooks, fn in self._hook_lists(before_forward, after_forward, before_backward, after_backward, passes):
            hooks.append(fn)

    def remove_hooks(self, before_forward=None, after_forward=None, before_backward=None, after_backward=None,
                     passes=None):
        """Take hooks given to :meth:`add_hooks` away again."""
        for hooks, fn in self._hook_lists(before_forward, after_forward, before_backward, after_backward, passes):
            hooks.remove(fn)

    def _hook_lists(self, *fns):
        lists = (self.before_forward_hooks, self.after_forward_hooks, self.before_backward_hooks,
                 self.backward_hooks, self.pass_hooks)
        return [(hooks, fn) for hooks, fn in zip(lists, fns) if fn is not None]

    def set_batch_group(self, group, types):
        """Make every layer of the given types (``"BatchNorm"``, ``"MultiBoxLoss"``) compute over the whole batch
        of ``group``'s replicas: ``group.sum(values)`` sums a float64 vector over them, ``group.count`` is how many
        there are (BatchNorm's statistics, MultiBoxLoss's match count). Returns the layers it was set on."""
        layers = [layer for layer in self.layers if layer.type in types]
        for layer in layers:
            layer.batch_group = group
        return layers

    # ------------------------------------------------------------------------------------------
    # running

    def _range(self, start, end):
        lo = 0 if start is None else self._index_of(start)
        hi = len(self.layers) - 1 if end is None else self._index_of(end)
        return lo, hi

    def _index_of(self, name):
        if isinstance(name, int):
            return name
        if name not in self._layer_index:
            raise LayerforgeError(f"no layer named '{name}'{suggest(name, self._layer_index)}")
        return self._layer_index[name]

    def set_inputs(self, **inputs):
        """Copy arrays into input blobs by name, then reshape the net once if any shape changed."""
        changed = False
        for name, array in inputs.items():
            if name not in self.inputs:
                raise LayerforgeError(f"'{name}' is not an input of net '{self.name}' "
                                      f"(inputs: {', '.join(self.inputs) or 'none'})")
            blob = self.blobs[name]
            array = self.xp.asarray(array, dtype=self.dtype)
            if tuple(array.shape) != tuple(blob.shape):
                blob.reshape(array.shape)
                changed = True
            blob.data[...] = array
        if changed:
            self.reshape()

    def reshape(self):
        """Propagate changed input shapes through every layer (Caffe's Net::Reshape)."""
        for e in self.entries:
            e.layer.reshape(e.bottom_blobs, e.top_blobs)
        if self._memory_plan is not None:
            self._memory_plan = memory.plan(self)

    @property
    def batch_size(self):
        """Samples per forward pass: the batch of the first Input, DummyData or data layer (None without one)."""
        sizes = batch_sizes([e.param for e in self.entries])
        return sizes[0][2] if sizes else None

    def optimize_memory(self, enable=True):
        """Share storage between activations (data and diffs) whose lives in a training iteration do not overlap.

        See :mod:`layerforge.net.memory`. Afterwards only inputs, outputs and what backward reads keep their
        values between passes; intermediate blobs may hold other blobs' values. ``enable=False`` undoes it.
        """
        if enable and self._memory_plan is None:
            self._split_sums = self._sums_by_consumers()
            for consumers in self._split_sums.values():
                for k, j in consumers[1:]:
                    self.layers[k].bottom_diffs_added = self.layers[k].bottom_diffs_added | {j}
            self._memory_plan = memory.plan(self)
        elif not enable and self._memory_plan is not None:
            memory.unplan(self, self._memory_plan)
            for consumers in self._split_sums.values():
                for k, j in consumers[1:]:
                    self.layers[k].bottom_diffs_added = frozenset()
            self._split_sums = {}
            self._memory_plan = None

    def _sums_by_consumers(self):
        """``{Split index: [(layer, bottom) of each consumer of its tops, in the order backward meets them]}`` for the
        host Splits whose consumers can make the Split's sum themselves (:meth:`optimize_memory`): each top read by
        one bottom of one layer that runs backward into it, and every consumer but the first backward meets one that
        adds its gradient (``Layer.adds_bottom_diffs``: Convolution). Their tops then share the bottom's diff
        (net/memory.py): the first consumer writes it, the others add to it, and the Split's backward has nothing left
        to do. That saves the Split's pass (two diffs read, one written: ResNet-50's 16 shortcuts, about 2% of a CPU
        step at batch 8, docs/performance.md); a convolution adds its product with beta = 1, where OpenBLAS would have
        zeroed its output first. The sum is made in the consumers' order, in their products' blocks: the Split's sum
        to float rounding."""
        if self.xp is not numpy:
            return {}

        def position(k):  # where backward runs layer k: a fused group at its last member
            group = self._fused.get(k)
            return group.last if group is not None else k
        sums = {}
        for i, entry in enumerate(self.entries):
            if entry.layer.type != "Split" or not (entry.need_backward and entry.bottom_need_backward[0]):
                continue
            consumers = []
            for t in entry.top_blobs:
                readers = [(k, j) for k in range(i + 1, len(self.entries))
                           for j, b in enumerate(self.entries[k].bottom_blobs) if b is t]
                if len(readers) == 1 and self.entries[readers[0][0]].need_backward and \
                        self.entries[readers[0][0]].bottom_need_backward[readers[0][1]]:
                    consumers.append(readers[0])
            if len(consumers) != len(entry.top_blobs) or len({k for k, _ in consumers}) != len(consumers):
                continue
            consumers.sort(key=lambda kj: -position(kj[0]))
            if all(self.layers[k].adds_bottom_diffs and k not in self._fused for k, _ in consumers[1:]):
                sums[i] = consumers
        return sums

    def memory_report(self):
        """Bytes of activations (as planned, and unplanned), parameters and layer-held arrays; see layerforge.net.memory."""
        return memory.memory_report(self)

    def forward(self, start=None, end=None, **inputs):
        """Run the layers from ``start`` to ``end`` (names; default all) after copying ``inputs`` into input blobs.

        Returns:
            ``{name: data array}`` for the net's output blobs. The weighted loss is in ``self.loss``.
        """
        if inputs:
            self.set_inputs(**inputs)
        if blas.batch_invariant():
            self._settle_forward_apart()
        lo, hi = self._range(start, end)
        loss = 0.0
        # a range that starts or ends inside a fused group runs that group's layers one by one, as written
        cut = [g for g in (self._fused.get(lo), self._fused.get(hi)) if g and not lo <= g.first <= g.last <= hi]
        for group in cut:
            group.ran_fused = False
        for hook in self.pass_hooks:
            hook("forward", False)
        with _blas_for_pass(self.xp):
            for i in range(lo, hi + 1):
                for hook in self.before_forward_hooks:
                    hook(i)
                loss += self.forward_layer(i, fuse=self._fused.get(i) not in cut)
                for hook in self.after_forward_hooks:
                    hook(i)
        self.loss = loss
        for hook in self.pass_hooks:
            hook("forward", True)
        return {name: self.blobs[name].data for name in self.outputs}

    def _settle_forward_apart(self):
        """Under batch invariance, AUTO's forward timing runs on scratch arrays before the first counted pass
        (kernels/autotune.settle_apart): its trial calls run other engines, whose sums differ, so an output computed
        by one would depend on when its batch came."""
        if self._auto_convolutions is None:
            self._auto_convolutions = [layer for layer in self.layers if hasattr(layer, "engine_choice")]
        if any(layer.engine_choice.get("forward", "") is None for layer in self._auto_convolutions):
            settle_apart(self, ("forward",))

    def forward_layer(self, i, fuse=True):
        """Run layer ``i``'s forward; returns its weighted loss contribution.

        A layer whose top shapes follow its data (Filter) may change them in forward: the layers after it
        are then reshaped at once, as Caffe's per-forward Reshape would. The first layer of a fused group
        (layerforge.net.fusion) runs the whole group unless ``fuse`` is False; the others then do nothing.
        """
        group = self._fused.get(i)
        if group is not None:
            if i == group.first:
                group.ran_fused = fuse
                if fuse:
                    with trace.span("forward", self._group_name(group), type="fused"):
                        group.forward()
                    return 0.0
            elif group.ran_fused:
                return 0.0
        entry = self.entries[i]
        top = entry.top_blobs
        shapes = [t.shape for t in top]
        try:
            with trace.layer("forward", entry.layer, entry.bottom_blobs, top):
                entry.layer.forward(entry.bottom_blobs, top)
        except LabelError as e:
            record = self._record_of(i, e.bottom, e.position)
            message = str(e)
            if self.split is not None and e.index:  # replica g of R holds samples g, g + R, ...: one process's index
                g, count = self.split
                whole = (e.index[0] * count + g,) + e.index[1:]
                message = message.replace(f"at index {e.index} ", f"at index {whole} ", 1)
            raise DataError(f"{message}: it comes from {record}" if record else message) from None
        if any(t.shape != s for t, s in zip(top, shapes)):
            for later in self.entries[i + 1:]:
                later.layer.reshape(later.bottom_blobs, later.top_blobs)
            if self._memory_plan is not None:
                self._memory_plan = memory.plan(self, forward_through=i)
        loss = 0.0
        for j, w in enumerate(entry.loss_weights):
            if w:
                loss += w * float(top[j].data.sum())
        return loss

    def backward(self, start=None, end=None):
        """Back-propagate from the loss: set loss-top diffs to their weights, run backward in reverse.

        Parameter diffs accumulate (call :meth:`clear_param_diffs` between iterations).

        Returns:
            ``{name: diff array}`` for the input blobs.
        """
        lo, hi = self._range(start, end)
        for group in (self._fused.get(lo), self._fused.get(hi)):
            if group and not lo <= group.first <= group.last <= hi:
                group.unfuse()  # a range that cuts a fused group runs its layers' own backward
        for hook in self.pass_hooks:
            hook("backward", False)
        with _blas_for_pass(self.xp):
            for i in range(hi, lo - 1, -1):
                for hook in self.before_backward_hooks:
                    hook(i)
                self.backward_layer(i)
                for hook in self.backward_hooks:
                    hook(i)
        for hook in self.pass_hooks:
            hook("backward", True)
        return {name: self.blobs[name].diff for name in self.inputs}

    def _record_of(self, i, bottom, position):
        """The data record behind element ``position`` of layer ``i``'s bottom ``bottom``, or None when no data
        layer that names its records produced it (through Split layers only)."""
        version, blob = self.entries[i].bottoms[bottom], self.entries[i].bottom_blobs[bottom]
        while True:
            k = next((k for k, e in enumerate(self.entries) if any(v is version for v in e.tops)), None)
            if k is None:
                return None
            if self.layers[k].type != "Split":
                break
            version = self.entries[k].bottoms[0]
        producer = self.layers[k]
        if not hasattr(producer, "record_of") or not hasattr(producer, "batch_position"):
            return None
        per_item = max(1, blob.count // max(1, blob.shape[0] if blob.shape else 1))
        return producer.record_of(position // per_item)

    def backward_layer(self, i):
        """Run layer ``i``'s backward if it takes part in backward.

        A parameter whose ``param_propagate_down`` is False (lr_mult 0) keeps its diff: the layer writes
        that gradient into a scratch array, which is dropped.
        """
        group = self._fused.get(i)
        if group is not None and group.ran_fused:
            if i == group.last:  # the whole group, at the first of its layers backward meets
                with trace.span("backward", self._group_name(group), type="fused"):
                    group.backward()
            return
        entry = self.entries[i]
        if not entry.need_backward or i in self._split_sums:  # (the Split's consumers made its sum)
            return
        layer = entry.layer
        if not layer.has_backward:
            lp = entry.param
            raise lp.error(f"{lp.type} layers have no backward, but this one is asked for a gradient; set "
                           "propagate_down: false where its top is read, or skip_undifferentiable: true", "type")
        top = entry.top_blobs
        for j, w in enumerate(entry.loss_weights):
            if w:
                top[j].diff[...] = w
        frozen = [b for b, down in zip(layer.blobs, layer.param_propagate_down) if not down]
        with _scratch_diffs(frozen, self.xp), trace.layer("backward", layer, entry.bottom_blobs, top):
            layer.backward(top, entry.bottom_need_backward, entry.bottom_blobs)

    def scratch_param_diffs(self, i):
        """A context in which layer ``i``'s parameters take their gradients in zeroed arrays of their own, dropped
        after it: the diffs the solver reads stay as they were (AUTO's trials on scratch arrays,
        kernels/autotune.settle_apart)."""
        return _scratch_diffs(self.layers[i].blobs, self.xp)

    def _group_name(self, group):
        return f"{self.layers[group.first].name}..{self.layers[group.last].name}"

    def forward_backward(self):
        """One forward and one backward pass; returns the loss."""
        with self.training_pass():
            self.forward()
            self.backward()
        return self.loss

    def _written_later(self, i, blob):
        # a later layer writes blob's values: in place on it, or on a blob that shares its array (a Split's top)
        share = self.xp.may_share_memory
        return any(top is blob or share(top.data, blob.data) for k in range(i + 1, len(self.layers))
                   for top in self.top_blobs(k))

    @contextlib.contextmanager
    def training_pass(self):
        """A context for one forward and the backward that follows it with nothing changing the blobs in between (the
        solver's step, ``layerforge time``): a convolution whose bottom no later layer writes keeps what its forward
        derives from it for its backward (Winograd's transformed input tiles: kernels/winograd.py), which a forward
        and backward apart (pycaffe's, whose caller may change a blob in between) compute again. What is kept is
        dropped at the end."""
        layers = [self.layers[i] for i in self._keeping]
        for layer in layers:
            layer.keep_for_backward = True
        try:
            yield
        finally:
            for layer in layers:
                layer.keep_for_backward = False
                layer.engines.drop_kept()

    def clear_param_diffs(self):
        """Zero every learnable parameter's diff (the gradients accumulate from here). A parameter that only one
        layer uses, a layer that runs backward and writes that diff whole (``Layer.overwrites_param_diffs``:
        InnerProduct's weights) gets its zeros deferred instead (``Blob.defer_clear_diff``): the layer's backward
        writes it without reading it, and anything that reads it first sees zeros."""
        cleared = []
        for blob in self.learnable_params:
            if id(blob) in self._overwritten_diffs:
                blob.defer_clear_diff()
            elif self.xp is numpy and blob.diff.flags.c_contiguous:
                cleared.append(blob)
            else:
                blob.clear_diff()
        fill_zeros([blob.diff for blob in cleared])  # on the kernel threads, about equal bytes each
        for blob in cleared:
            blob.clear_diff(written=True)

    def _whole_diff_writers(self):
        """``{id(blob)}`` of the parameters :meth:`clear_param_diffs` defers (see there)."""
        users = collections.Counter(id(b) for layer in self.layers for b in layer.blobs)
        return {id(e.layer.blobs[k]) for e in self.entries if e.need_backward
                for k in e.layer.overwrites_param_diffs if users[id(e.layer.blobs[k])] == 1}

    # ------------------------------------------------------------------------------------------
    # introspection

    @property
    def layer_dict(self):
        return collections.OrderedDict((layer.name, layer) for layer in self.layers)

    def bottom_names(self, i):
        return [v.name for v in self.entries[i].bottoms]

    def top_names(self, i):
        return [v.name for v in self.entries[i].tops]

    def top_blobs(self, i):
        return self.entries[i].top_blobs

    def bottom_blobs(self, i):
        return self.entries[i].bottom_blobs

    def loss_weights(self, i):
        return list(self.entries[i].loss_weights)

    # ------------------------------------------------------------------------------------------
    # weights

    def param_keys(self):
        """``[(key, blobs)]`` for every layer with parameters, in order. The key is the layer's name; the k-th
        layer (k >= 2) of a repeated name is ``name#k``, so weights files keep every layer, and a file written
        by Caffe's names fills the first layer of each name, as Caffe's CopyTrainedLayersFrom does."""
        seen, keys = collections.Counter(), []
        for layer in self.layers:
            if layer.blobs:
                seen[layer.name] += 1
                k = seen[layer.name]
                keys.append((layer.name if k == 1 else f"{layer.name}#{k}", layer.blobs))
        return keys

    def state_arrays(self):
        """``{"<layer key>/<index>": array}`` of every layer's parameter blobs (host arrays; keys: :meth:`param_keys`)."""
        return {f"{name}/{j}": backend.to_numpy(b.data) for name, blobs in self.param_keys() for j, b in enumerate(blobs)}

    def save(self, path):
        """Write all parameter blobs to ``path`` (.npz, atomically)."""
        save_npz_atomic(path, self.state_arrays())

    def load(self, path):
        """Load weights saved by :meth:`save`; every parameter of this net must be in the file."""
        arrays = load_npz(path)
        missing = [k for k in self.state_arrays() if k not in arrays]
        if missing:
            raise LayerforgeError(f"{path}: has no weights for {missing[0]}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        self._copy_arrays(arrays, path)

    def copy_from(self, path_or_arrays):
        """Copy weights by layer name (Caffe's CopyTrainedLayersFrom): layers absent from the file keep theirs.

        A ``.caffemodel`` / ``.caffemodel.h5`` path is read by layerforge.caffe.caffemodel, with Caffe's rules.
        Returns the names of the layers that took weights.

        A file none of whose weights belongs to a layer of this net is an error: Caffe copies nothing then,
        without a word, which is never what was meant.
        """
        from ..caffe.caffemodel import copy_trained_layers, is_caffe_weights
        source = path_or_arrays if not isinstance(path_or_arrays, dict) else "<weights>"
        if not isinstance(path_or_arrays, dict) and is_caffe_weights(path_or_arrays):
            filled = copy_trained_layers(self, path_or_arrays)
        else:
            arrays = load_npz(path_or_arrays) if not isinstance(path_or_arrays, dict) else path_or_arrays
            filled = self._copy_arrays(arrays, source)
        holders = [name for name, _ in self.param_keys()]
        if holders and not filled:
            shown = ", ".join(f"'{n}'" for n in holders[:4]) + (", ..." if len(holders) > 4 else "")
            raise LayerforgeError(f"{source}: no layer of net '{self.name}' has weights in this file (the layers "
                                  f"with weights are {shown}); were they written for another net?")
        return filled

    def share_params_with(self, other):
        """Read ``other``'s parameter data (the same arrays) in every layer that has a layer of the same name
        there, as Caffe's ShareTrainedLayersWith does (data only: each net keeps its own diffs). The solver's
        test nets share the train net's weights so, and see every update without a copy."""
        theirs_by_key = dict(other.param_keys())
        for name, blobs in self.param_keys():
            source = theirs_by_key.get(name)
            if source is None:
                continue
            shapes, theirs = [tuple(b.shape) for b in blobs], [tuple(b.shape) for b in source]
            if shapes != theirs:
                raise LayerforgeError(f"layer '{name}' has parameter shapes {shapes} in net '{self.name}' ({self.phase}) "
                                      f"but {theirs} in net '{other.name}' ({other.phase})")
            for b, s in zip(blobs, source):
                b.share_data(s)

    def _copy_arrays(self, arrays, source):
        filled = []
        for name, blobs in self.param_keys():
            for j, blob in enumerate(blobs):
                key = f"{name}/{j}"
                if key not in arrays:
                    continue
                if not filled or filled[-1] != name:
                    filled.append(name)
                shape = tuple(shape_of(arrays, key))  # from the header alone: a wrong entry is never read
                if shape != tuple(blob.shape):
                    raise LayerforgeError(f"{source}: layer '{name}' parameter {j} has shape {shape} in the file "
                                          f"but {tuple(blob.shape)} in the net")
                blob.data[...] = self.xp.asarray(arrays[key], dtype=self.dtype)
        return filled

    def __repr__(self):
        return f"<Net '{self.name}' phase={self.phase} layers={len(self.layers)}>"


@contextlib.contextmanager
def _scratch_diffs(blobs, xp):
    # the blobs' diffs are zeroed arrays of their own within the block, and the kept ones again after it
    kept = [b.diff for b in blobs]
    for b in blobs:
        b.diff = xp.zeros_like(b.diff)
    try:
        yield
    finally:
        for b, diff in zip(blobs, kept):
            b.diff = diff


def _blas_for_pass(xp):
    """Under batch invariance, a CPU pass's BLAS calls run on one BLAS thread each (blas.one_blas_thread) and the
    large products split themselves over the kernel threads: a BLAS call that OpenBLAS shared between its own threads
    (a bias gradient's GEMV) would leave them spinning on the cores the kernel threads need for the rest of the pass
    and the next."""
    return blas.one_blas_thread() if xp is numpy and blas.batch_invariant() else contextlib.nullcontext()
