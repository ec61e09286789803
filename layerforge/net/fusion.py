"""Fused BatchNorm + Scale (+ ReLU), and Eltwise SUM + ReLU: net-build optimisations for Caffe's ResNet patterns.

Where a net has, one after the other and all in place on one blob,

    BatchNorm  ->  Scale (one bottom, ``bias_term: true``, a per-channel scale: axis 1, num_axes 1)  ->  [ReLU]

(negative_slope >= 0, no loss weight on any of them), the three run as one: forward takes the statistics in
one sweep and writes x_norm and ``relu(gamma x_norm + beta)`` (straight into the blob) in one more; backward
turns the blob's diff into the input's with one sweep for two per-channel sums and one for the gradient
(``kernels.fused_batch_norm``). On the CPU the two sweeps of each direction run channel by channel, the second
reading the channel from the core's cache (where replicas exchange the statistics, in between: the whole arrays
each); where no later layer writes the blob in place, these take the ReLU's mask from
x_norm and forward's gamma and beta, to the same bits, rather than read the blob. Unfused,
BatchNorm keeps ``x_norm``, Scale keeps a copy of its (in-place) input for the gamma gradient, and the
forward copies x_norm into the blob; fused, only ``x_norm`` (BatchNorm's own attribute) is kept, so each
group holds one activation-sized array fewer (``Net.memory_report``'s ``cache_bytes``).

The layers stay in ``Net.layers`` with their own blobs (BatchNorm's three statistics, Scale's gamma and beta):
snapshots, weights files, caffemodel and ONNX export, pycaffe's ``net.params`` see the unfused net. The group
runs forward at its BatchNorm's index (``Net.forward_layer``) and backward at its last layer's
(``Net.backward_layer``); the other layers then do nothing in that pass, so ``layerforge time`` shows the
group's forward on the BatchNorm row and its backward on the ReLU's (or Scale's). A ``Net.forward`` range
or ``Net.backward`` range that starts or ends inside a group runs its layers one by one. A chain in which a
member stops backward (``propagate_down: false``) while others need it is not fused, so each layer keeps
Caffe's backward flags. ``fuse_batch_norm: false`` (a net key) turns this fusion off. Eltwise SUM + ReLU
(:class:`EltwiseSumReLU`) always fuses: it gives the layers' own bits. A BatchNorm + Scale group without a ReLU whose
blob the next join reads (ResNet's block ends: the last convolution's BatchNorm, then the shortcut's join) runs with
that join as one (:class:`BatchNormScaleSumReLU`), to the two groups' bits.
"""
import numpy

from ..kernels.fused_batch_norm import (batch_normalize_scale_shift_relu, bn_scale_relu_backward,
                                         normalize_scale_shift_relu)
from ..kernels.relu import sum_relu, sum_relu_backward


class BatchNormScaleReLU:
    """One fused group of ``net``: the BatchNorm at ``first``, the Scale after it, the ReLU at ``last`` if any."""

    def __init__(self, net, first, last):
        self.net, self.first, self.last = net, first, last
        self.batch_norm, self.scale = net.layers[first], net.layers[first + 1]
        self.relu = net.layers[first + 2] if last == first + 2 else None
        self.ran_fused = False  # whether the last forward ran fused (backward must then too)
        # no later layer writes the blob in place: backward finds the output as forward left it, and recomputes the
        # ReLU's mask from x_norm and forward's (gamma, beta) instead of reading the blob (kernels.batch_norm)
        blob = net.bottom_blobs(first)[0]
        self.output_kept = not any(top is blob for k in range(last + 1, len(net.layers)) for top in net.top_blobs(k))
        self.affine = None

    @property
    def members(self):
        return range(self.first, self.last + 1)

    @property
    def negative_slope(self):
        return None if self.relu is None else self.relu.negative_slope

    @property
    def one_sweep(self):
        """Whether forward takes the statistics and writes the output in one sweep of the channels (the host, with the
        batch's statistics of this process alone)."""
        bn = self.batch_norm
        return self.net.xp is numpy and not bn.use_global_stats and bn.batch_group is None

    def forward(self, join=None):
        """``join``: the EltwiseSumReLU after the group (BatchNormScaleSumReLU), whose sum and ReLU the one sweep
        makes too (:attr:`one_sweep` only)."""
        self.scale.x = None  # a copy that unfuse() made is not needed
        blob, bn = self.net.bottom_blobs(self.first)[0], self.batch_norm
        x = _channels(blob.data, bn.channels)
        gamma, beta = (b.data for b in self.scale.blobs)
        x_norm = bn.x_norm_buffer(x.shape)
        if self.one_sweep:
            slope, residual, out = self.negative_slope, None, None
            if join is not None:
                shortcut = next(b for b in self.net.bottom_blobs(join.first) if b is not blob)
                slope, residual, out = join.relu.negative_slope, _channels(shortcut.data, bn.channels), _channels(
                    self.net.top_blobs(join.first)[0].data, bn.channels)
                join.ran_fused = True
            mean, var = batch_normalize_scale_shift_relu(x, bn.layer_param.batch_norm.eps, gamma, beta, slope, x_norm,
                                                         residual, out)
            bn.record_batch_statistics(x, mean, var)
        else:
            mean, inv_std = bn.statistics(blob.data)
            normalize_scale_shift_relu(x, mean, inv_std, gamma, beta, self.negative_slope, x_norm)
        self.affine = (gamma.copy(), beta.copy()) if self.output_kept else None
        self.ran_fused = True

    def unfuse(self):
        """After a fused forward, let each layer run its own backward (a backward range that cuts the group):
        Scale's input, which its own forward would have copied, is BatchNorm's x_norm."""
        if self.ran_fused:
            blob = self.net.bottom_blobs(self.first)[0]
            self.scale.x = self.batch_norm.x_norm.reshape(blob.shape).copy()
            self.ran_fused = False

    def backward(self, gy=None):
        """The group's gradients from its blob's diff, or from ``gy`` (the join after it: BatchNormScaleSumReLU), the
        input gradient then written into the blob's diff."""
        net, bn = self.net, self.batch_norm
        if not any(net.entries[k].need_backward for k in self.members):
            return
        blob, scale = net.bottom_blobs(self.first)[0], self.scale
        g_gamma, g_beta = (b.diff if down else None for b, down in zip(scale.blobs, scale.param_propagate_down))
        diff = _channels(blob.diff, bn.channels)
        gy = diff if gy is None else _channels(gy, bn.channels)
        bn_scale_relu_backward(gy, _channels(blob.data, bn.channels), bn.x_norm, 1 / bn.std, scale.blobs[0].data,
                               self.negative_slope, not bn.use_global_stats, g_gamma, g_beta,
                               gx=diff if net.entries[self.first].bottom_need_backward[0] else None,
                               group=bn.batch_group, affine=self.affine)


def batch_norm_groups(net):
    """``{layer index: BatchNormScaleReLU}`` for every member of every fusable group of ``net`` (module docstring)."""
    groups, layers = {}, net.layers
    for i, bn in enumerate(layers[:-1]):
        if bn.type != "BatchNorm" or not _in_place(net, i, net.bottom_blobs(i)[0]):
            continue
        blob, scale = net.bottom_blobs(i)[0], layers[i + 1]
        if not (scale.type == "Scale" and _in_place(net, i + 1, blob) and scale.has_bias_term()
                and len(scale.blobs) == 2 and scale.axis == 1 and tuple(scale.blobs[0].shape) == (bn.channels,)):
            continue
        last = i + 1
        relu = layers[i + 2] if i + 2 < len(layers) else None
        if relu is not None and relu.type == "ReLU" and _in_place(net, i + 2, blob) and relu.negative_slope >= 0:
            last = i + 2
        if any(w for k in range(i, last + 1) for w in net.loss_weights(k)):
            continue
        members = range(i, last + 1)
        entries = [net.entries[k] for k in members]
        if any(e.need_backward for e in entries) and not all(e.need_backward and all(e.bottom_need_backward)
                                                             for e in entries):
            continue  # a member stops backward (propagate_down: false): Caffe's flags hold only layer by layer
        group = BatchNormScaleReLU(net, i, last)
        groups.update((k, group) for k in group.members)
    return groups


class EltwiseSumReLU:
    """Eltwise SUM of two bottoms (coefficients 1) at ``first`` and the ReLU in place on its top at ``first + 1``
    (ResNet's shortcut joins), run as one pass each way (kernels.relu): forward writes ``relu(a + b)`` into the top,
    backward turns the top's diff into the ReLU's input gradient, in place as the layer leaves it, and copies it into
    both bottoms' diffs. The same bits as the two layers one by one. ``layerforge time`` shows the forward on the
    Eltwise row and the backward on the ReLU's."""

    def __init__(self, net, first):
        self.net, self.first, self.last = net, first, first + 1
        self.relu = net.layers[first + 1]
        self.ran_fused = False

    @property
    def members(self):
        return range(self.first, self.last + 1)

    def forward(self):
        (a, b), top = self.net.bottom_blobs(self.first), self.net.top_blobs(self.first)[0]
        sum_relu(a.data, b.data, self.relu.negative_slope, top.data)
        self.ran_fused = True

    def unfuse(self):
        """The layers' own backward needs nothing that the fused forward did not leave."""
        self.ran_fused = False

    def backward(self):
        net = self.net
        if not any(net.entries[k].need_backward for k in self.members):
            return
        bottom, top = net.bottom_blobs(self.first), net.top_blobs(self.first)[0]
        down = net.entries[self.first].bottom_need_backward
        sum_relu_backward(top.diff, top.data, self.relu.negative_slope,
                          *(b.diff if wanted else None for b, wanted in zip(bottom, down)))


def eltwise_relu_groups(net):
    """``{layer index: EltwiseSumReLU}`` for every member of every Eltwise SUM + in-place ReLU pair of ``net``."""
    groups, layers = {}, net.layers
    for i, eltwise in enumerate(layers[:-1]):
        relu = layers[i + 1]
        if eltwise.type != "Eltwise" or relu.type != "ReLU":
            continue
        p, bottom, top = eltwise.layer_param.eltwise, net.bottom_blobs(i), net.top_blobs(i)
        if (p.operation != "SUM" or any(c != 1 for c in p.coeff) or len(bottom) != 2 or len(top) != 1
                or any(b is top[0] for b in bottom) or not _in_place(net, i + 1, top[0]) or relu.negative_slope < 0
                or any(w for k in (i, i + 1) for w in net.loss_weights(k))
                or net.entries[i].need_backward != net.entries[i + 1].need_backward):
            continue
        group = EltwiseSumReLU(net, i)
        groups.update((k, group) for k in group.members)
    return groups


class BatchNormScaleSumReLU:
    """A BatchNorm + Scale group (no ReLU) followed by the Eltwise SUM + ReLU join that reads its blob (ResNet's last
    convolution of a block and its shortcut): run as one. Forward, on the host with the batch's statistics, each
    channel's BatchNorm + Scale output is added to the shortcut and ReLU'd while it is in the core's cache (the join
    would read it back from memory); backward, the join's gradient goes to the shortcut's diff, and the BatchNorm
    group takes it from the join's top diff and writes its input gradient into the blob's (where the join would have
    copied it there first). The BatchNorm group's blob still holds ``gamma x_norm + beta``; the bits are the two
    groups' one after the other. ``layerforge time`` shows the forward on the BatchNorm row and the backward on the
    join's ReLU's."""

    def __init__(self, net, batch_norm, join):
        self.net, self.batch_norm, self.join = net, batch_norm, join
        self.first, self.last = batch_norm.first, join.last
        self.ran_fused = False

    @property
    def members(self):
        return range(self.first, self.last + 1)

    def forward(self):
        if self.batch_norm.one_sweep:
            self.batch_norm.forward(join=self.join)
        else:
            self.batch_norm.forward()
            self.join.forward()
        self.ran_fused = True

    def unfuse(self):
        """A backward range that cuts the group runs its layers' own backward (see the groups')."""
        self.batch_norm.unfuse()
        self.join.unfuse()
        self.ran_fused = False

    def backward(self):
        net, join = self.net, self.join
        if not any(net.entries[k].need_backward for k in self.members):
            return
        down = net.entries[join.first].bottom_need_backward
        bottom, top = net.bottom_blobs(join.first), net.top_blobs(join.first)[0]
        blob = net.bottom_blobs(self.first)[0]
        wanted = [b.diff if want and b is not blob else None for b, want in zip(bottom, down)]
        sum_relu_backward(top.diff, top.data, join.relu.negative_slope, *wanted)
        if down[[b is blob for b in bottom].index(True)]:
            self.batch_norm.backward(gy=top.diff)


def residual_join_groups(net, groups):
    """``{layer index: BatchNormScaleSumReLU}`` for the BatchNorm + Scale groups of ``groups`` (no ReLU) whose blob the
    Eltwise SUM + ReLU group right after them reads, with another bottom, and nothing else does."""
    joined = {}
    for group in {id(g): g for g in groups.values()}.values():
        if not isinstance(group, BatchNormScaleReLU) or group.relu is not None:
            continue
        join = groups.get(group.last + 1)
        blob = net.bottom_blobs(group.first)[0]
        if not isinstance(join, EltwiseSumReLU) or join.first != group.last + 1 or \
                sum(b is blob for b in net.bottom_blobs(join.first)) != 1:
            continue
        if net.entries[group.first].need_backward != net.entries[join.first].need_backward:
            continue
        merged = BatchNormScaleSumReLU(net, group, join)
        joined.update((k, merged) for k in merged.members)
    return joined


def _channels(a, channels):
    return a.reshape(a.shape[0], channels, -1)  # (N, C, S), as BatchNorm sees its blob


def _in_place(net, i, blob):
    bottom, top = net.bottom_blobs(i), net.top_blobs(i)
    return len(bottom) == 1 and len(top) == 1 and bottom[0] is blob and top[0] is blob
