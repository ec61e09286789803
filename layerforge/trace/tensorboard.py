"""TensorBoard scalars of a training run, written with tensorboardX.

Why tensorboardX: it writes TensorBoard's event files (protobuf records with CRCs) from numpy values alone, is
pure Python and small (its runtime needs numpy, packaging and protobuf, which layerforge already has), and is
maintained. ``torch.utils.tensorboard`` would make torch a runtime dependency; the ``tensorboard`` package's
own writer (``tensorboard.summary.Writer``) is marked experimental, and the package brings grpcio and a server.
tensorboardX imports torch when torch happens to be installed (about 1.5 s, once, only with ``--tensorboard``).

Tags (the iteration is the step):

- ``train/loss``: the iteration's loss (mean over iter_size passes); ``train/learning_rate``;
- ``train/images_per_second``: images of all ranks over the wall time since the previous iteration (from
  the second iteration written on);
- ``train/data_wait_ms``, ``train/comm_exposed_ms``: what the compute thread waited for input and for the
  gradient exchange during that iteration (``layerforge.trace.wait``, measured whether or not a trace is
  being recorded);
- ``test/<output>`` per test net output (``test<k>/<output>`` for test net k > 0; ``/<i>`` per element of an
  output with several values).
"""
import numpy

from ..errors import LayerforgeError
from ..npz import check_writable
from . import recorder


class ScalarWriter:
    """Writes the scalars above to the event files of ``logdir``.

    Args:
        logdir: the folder TensorBoard is pointed at (``tensorboard --logdir DIR``); made if missing.
        images_per_iteration: images one iteration trains on, over all ranks (batch x iter_size x ranks);
            None leaves out ``train/images_per_second``.
        flush_secs: how often tensorboardX's thread writes buffered records to disk.
    """

    def __init__(self, logdir, images_per_iteration=None, flush_secs=10):
        check_writable(logdir, "--tensorboard")
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise LayerforgeError("--tensorboard needs the tensorboardX package (pip install tensorboardX)") from None
        self.logdir, self.images = logdir, images_per_iteration
        self.writer = SummaryWriter(logdir, flush_secs=flush_secs)
        self._time = None  # no rate for the first iteration: the time since setup is not one
        self._waited = recorder.waited()

    def train(self, iteration, loss, learning_rate=None):
        """Scalars of the iteration that just finished (call it once per iteration, on rank 0)."""
        now, waits = recorder.clock(), recorder.waited()
        add = self.writer.add_scalar
        add("train/loss", float(loss), iteration)
        if learning_rate is not None:
            add("train/learning_rate", float(learning_rate), iteration)
        if self.images and self._time is not None and now > self._time:
            add("train/images_per_second", self.images / (now - self._time), iteration)
        add("train/data_wait_ms", (waits["data"] - self._waited["data"]) * 1e3, iteration)
        add("train/comm_exposed_ms", (waits["comm"] - self._waited["comm"]) * 1e3, iteration)
        self._time, self._waited = now, waits

    def test(self, iteration, scores, net_index=0):
        """The mean outputs ``{name: value or array}`` of test net ``net_index`` after a test pass."""
        prefix = "test" if net_index == 0 else f"test{net_index}"
        for name, value in (scores or {}).items():
            values = numpy.asarray(value, dtype=numpy.float64).reshape(-1)
            if values.size == 1:
                self.writer.add_scalar(f"{prefix}/{name}", float(values[0]), iteration)
            else:
                for i, v in enumerate(values):
                    self.writer.add_scalar(f"{prefix}/{name}/{i}", float(v), iteration)

    def close(self):
        """Write what is buffered and close the event file."""
        self.writer.close()
