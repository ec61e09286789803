"""BatchNorm: per-channel normalisation with running statistics, exactly as Caffe's BatchNormLayer."""
from ..blob import Blob
from ..errors import ShapeError
from ..kernels.batch_norm import batch_norm_backward, batch_stats, normalize
from .base import Field, Layer, register_layer


@register_layer("BatchNorm")
class BatchNorm(Layer):
    """y = (x - mu_c) / sqrt(var_c + eps) per channel c = axis 1, over N and the spatial axes; no affine.

    x: (N, C, ...) -> y of the same shape (a 1-D x is treated as (N, 1)); works in place. Follow it by
    a Scale layer with ``bias_term: true`` for Caffe's learnable gamma and beta; in place, the two (and a
    ReLU after them) run fused unless the net says ``fuse_batch_norm: false`` (``layerforge.net.fusion``).

    Blobs (running statistics, not weights, so ``learnable`` is False and the net gives them lr_mult 0):
    ``blobs[0]`` sum of means (C,), ``blobs[1]`` sum of variances (C,), ``blobs[2]`` the scale factor (1,).
    With batch statistics (TRAIN by default), each forward uses the batch's mu and biased var and then
    updates, with f = ``moving_average_fraction`` and m = N * spatial size::

        blobs[0] = f * blobs[0] + mu;  blobs[1] = f * blobs[1] + m / (m - 1) * var;  blobs[2] = f * blobs[2] + 1

    With global statistics (``use_global_stats``, TEST by default) mu = blobs[0] / blobs[2] and
    var = blobs[1] / blobs[2] (0 while blobs[2] is 0), and y is a per-channel affine map of x.

    Backward, with s = sqrt(var + eps) and means over N and spatial axes: batch statistics
    gx = (gy - mean(gy) - mean(gy * y) * y) / s; global statistics gx = gy / s. The batch-statistics
    passes run through :mod:`layerforge.kernels.batch_norm` (batch_norm.cu on cupy arrays). Replicas that
    each hold a share of one batch (``batch_group``, set by data parallelism through ``Net.set_batch_group``)
    use the whole batch's statistics and means, exchanged per layer: together they normalise exactly as one
    process does.
    """

    param_blocks = {"batch_norm": {
        "use_global_stats": Field("bool", None, doc="normalise with the running statistics "
                                                    "(default: false in TRAIN, true in TEST)"),
        "moving_average_fraction": Field("float", 0.999, min=0.0, max=1.0, doc="decay of the running statistics"),
        "eps": Field("float", 1e-5, min=0.0, doc="added to the variance before the square root"),
    }}
    backward_reads = ()  # it keeps its own copy of y and s: in place, top data may be overwritten downstream
    learnable = False
    batch_group = None  # replicas of a split batch: their statistics are the whole batch's (kernels.batch_norm)

    def layer_setup(self, bottom, top):
        p = self.layer_param.batch_norm
        self.use_global_stats = (self.phase == "TEST") if p.use_global_stats is None else p.use_global_stats
        self.channels = bottom[0].shape[1] if len(bottom[0].shape) > 1 else 1
        self.blobs = [Blob(shape, self.dtype, self.xp) for shape in ((self.channels,), (self.channels,), (1,))]

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        channels = shape[1] if len(shape) > 1 else 1
        if len(shape) == 0 or channels != self.channels:
            raise ShapeError(f"bottom shape {shape} has {channels if shape else 'no'} channels on axis 1, but the "
                             f"layer was set up for {self.channels}", key="bottom[0]")
        top[0].reshape(shape)

    def _view(self, a):
        # (N, C, S): the statistics run over axes 0 and 2
        return a.reshape(a.shape[0], self.channels, -1)

    def forward(self, bottom, top):
        top[0].data[...] = self.normalise(bottom[0].data).reshape(top[0].shape)

    def normalise(self, x):
        """``self.x_norm`` (N, C, S) = normalised ``x`` (and ``self.std``, the running statistics updated as the
        phase says)."""
        mean, inv_std = self.statistics(x)
        x = self._view(x)
        normalize(x, mean, inv_std, out=self.x_norm_buffer(x.shape))
        return self.x_norm

    def statistics(self, x):
        """The per-channel ``(mean, 1 / std)`` that normalise ``x`` (N, C, ...): the batch's (the running statistics
        updated) or the running ones, as the phase says; ``self.std`` is set. The fused BatchNorm + Scale (+ ReLU) of
        layerforge.net.fusion normalises with them in its own pass."""
        x = self._view(x)
        if self.use_global_stats:
            sf = float(self.blobs[2].data[0])
            sf = 0.0 if sf == 0 else 1.0 / sf
            mean, var = sf * self.blobs[0].data, sf * self.blobs[1].data
            self.std = self.xp.sqrt(var + self.layer_param.batch_norm.eps).astype(self.dtype, copy=False)
        else:  # batch_norm.cu on cupy
            mean, var = batch_stats(x, group=self.batch_group)
            self.record_batch_statistics(x, mean, var)
        return mean, 1 / self.std

    def record_batch_statistics(self, x, mean, var):
        """The running statistics updated with the batch's ``mean`` and biased ``var`` of ``x`` (N, C, S), and
        ``self.std`` set: what :meth:`statistics` does after it computes them (the fused forward computes them in
        its own sweep)."""
        p = self.layer_param.batch_norm
        m = x.shape[0] * x.shape[2] * (1 if self.batch_group is None else self.batch_group.count)
        f = p.moving_average_fraction
        self.blobs[2].data *= f
        self.blobs[2].data += 1
        self.blobs[0].data[...] = f * self.blobs[0].data + mean
        self.blobs[1].data[...] = f * self.blobs[1].data + (m / (m - 1) if m > 1 else 1.0) * var
        self.std = self.xp.sqrt(var + p.eps).astype(self.dtype, copy=False)

    def x_norm_buffer(self, shape):
        """``self.x_norm``, (re)made to the (N, C, S) ``shape``: the array the normalised input is written into."""
        x_norm = getattr(self, "x_norm", None)
        if x_norm is None or x_norm.shape != shape:
            self.x_norm = self.xp.empty(shape, dtype=self.dtype)
        return self.x_norm

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = self.xp
        gy = self._view(top[0].diff)
        gx = self._view(bottom[0].diff)  # may be gy itself (in place): every step below is element-wise
        inv_std = (1 / self.std)[None, :, None]
        if self.use_global_stats:
            xp.multiply(gy, inv_std, out=gx)
            return
        batch_norm_backward(gy, self.x_norm, 1 / self.std, out=gx, group=self.batch_group)
