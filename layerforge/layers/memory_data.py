"""MemoryData: batches cut from arrays handed in from Python (Caffe's MemoryDataLayer and its Reset)."""
import numpy

from ..errors import DataError, ShapeError
from ..schema import REQUIRED
from .base import Field, Layer, register_layer


@register_layer("MemoryData")
class MemoryData(Layer):
    """Serves batches of arrays given with ``reset(data, labels)``, cycling through them.

    ``data`` (n, C, H, W) float32 and ``labels`` (n,) (or (n, 1, 1, 1)), n a multiple of batch_size: forward
    k writes rows ``[p, p + N)`` with p = k N mod n to the tops ``data`` (N, C, H, W) and ``label`` (N,),
    N = batch_size, C, H, W = channels, height, width. Nothing is transformed. Reach the layer of a
    built net by name: ``net.layer_dict["name"].reset(data, labels)``.
    """

    num_bottom = (0, 0)
    num_top = (2, 2)
    backward_reads = ()
    has_backward = False
    param_blocks = {
        "memory_data": {
            "batch_size": Field("int", REQUIRED, min=1, doc="rows per batch"),
            "channels": Field("int", REQUIRED, min=1, doc="C of the data"),
            "height": Field("int", REQUIRED, min=1, doc="H of the data"),
            "width": Field("int", REQUIRED, min=1, doc="W of the data"),
        },
    }

    def layer_setup(self, bottom, top):
        p = self.layer_param.memory_data
        self.batch_size, self.shape = p.batch_size, (p.channels, p.height, p.width)
        self.data = self.labels = None
        self.pos = 0

    def reshape(self, bottom, top):
        top[0].reshape((self.batch_size,) + self.shape)
        top[1].reshape(self.batch_size)

    def reset(self, data, labels):
        """Serve ``data`` (n, C, H, W) float32 and ``labels`` (n,) from the next forward on (copies are kept)."""
        where = f"layer '{self.name}' (MemoryData): reset"
        xp = self.xp
        data, labels = xp.asarray(data), xp.asarray(labels)
        if data.dtype != numpy.float32:
            raise DataError(f"{where}: data must be float32, got {data.dtype}")
        if data.ndim != 4 or data.shape[1:] != self.shape:
            raise ShapeError(f"{where}: data must have shape (n, {', '.join(map(str, self.shape))}), "
                             f"got {tuple(data.shape)}", "memory_data")
        n = data.shape[0]
        if n == 0 or n % self.batch_size:
            raise ShapeError(f"{where}: the number of rows {n} must be a positive multiple of batch_size "
                             f"{self.batch_size}", "memory_data.batch_size")
        if labels.dtype.kind not in "biuf" or labels.size != n or labels.shape[0] != n:
            raise ShapeError(f"{where}: labels must be {n} numbers, shape ({n},) or ({n}, 1, 1, 1), got "
                             f"{labels.dtype} {tuple(labels.shape)}", "memory_data")
        self.data, self.labels = data.astype(self.dtype), labels.reshape(n).astype(self.dtype)
        self.pos = 0

    def forward(self, bottom, top):
        if self.data is None:
            raise DataError(f"layer '{self.name}' (MemoryData): no data: call reset(data, labels) on the layer "
                            "before the first forward")
        rows = slice(self.pos, self.pos + self.batch_size)
        top[0].data[...] = self.data[rows]
        top[1].data[...] = self.labels[rows]
        self.pos = (self.pos + self.batch_size) % len(self.data)

    def backward(self, top, propagate_down, bottom):
        pass
