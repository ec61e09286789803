"""A training iteration's body recorded once as CUDA graphs and replayed (solver key ``cuda_graph``).

Python launches every kernel of an eager iteration one by one; a recorded graph launches them all in one
call. Not every part of an iteration can be recorded: the data layers run host code, and the loss layers
check labels and read the loss on the host. So the net is cut into three ranges:

- the data layers (the leading layers without bottoms) and everything from the first layer with a loss
  weight on run as usual, every iteration;
- the *body* between them (from the first layer with a bottom to the layer before the first loss) runs
  its forward as one recorded graph and its backward as another.

An iteration is: data forward, body forward graph, loss forward and backward, body backward graph. The
graphs are recorded at the first iteration after every AUTO convolution has settled (so the engines no
longer change), on the iteration's own non-default stream and into a memory pool of their own, which no
other allocation uses: the addresses a graph baked in stay its own. A layer that a replay would not
redo (``Layer.capturable`` False: Dropout, stochastic pooling, Filter, Python layers) keeps the solver
from recording at all, with one line naming it. A host synchronisation inside the body that recording
meets (a layer reading a device value on the host) ends the recording: the solver logs the layer and the
error once and goes on without graphs, with the same results.

A graph holds raw device addresses and keeps nothing alive. So the graphs keep the shared convolution
workspaces they were recorded with (``kernels.workspace._ARENAS`` may replace or drop them later), and before
each replay the addresses and shapes of every blob array of the body are compared with those at
recording: when a reshape has moved one, both graphs are recorded again.
"""
import contextlib
import logging

from ..backend import data_address

log = logging.getLogger("layerforge")


def body_range(net):
    """``(lo, hi)``: the layer indices of ``net``'s body (both included), or None when it has none."""
    bottoms = [len(net.bottom_names(i)) for i in range(len(net.layers))]
    lo = next((i for i, n in enumerate(bottoms) if n), None)
    if lo is None:
        return None
    first_loss = next((i for i in range(lo, len(net.layers)) if any(net.loss_weights(i))), len(net.layers))
    return (lo, first_loss - 1) if first_loss - 1 >= lo else None


def refusal(net, iter_size):
    """Why ``net`` cannot run its body as graphs (a sentence), or None when it can."""
    if net.xp.__name__ != "cupy":
        return "cuda_graph needs solver_mode GPU (CUDA graphs record device work)"
    return body_refusal(net, iter_size)


def body_refusal(net, iter_size):
    """:func:`refusal` less the device: what in the net or the solver keeps its body from being recorded."""
    if net.backward_hooks:
        return "cuda_graph cannot record per-layer backward hooks (the overlapped allreduce): set " \
               "allreduce_overlap: false"
    if iter_size != 1:
        return f"cuda_graph needs iter_size 1 (a recorded backward cannot tell a first pass from a later one); " \
               f"iter_size is {iter_size}"
    body = body_range(net)
    if body is None:
        return "cuda_graph: the net has no layers between its data layers and its first loss to record"
    lo, hi = body
    for i in range(lo, hi + 1):
        layer = net.layers[i]
        if not net.bottom_names(i) and layer.type != "Parameter":
            return (f"cuda_graph: layer '{layer.name}' ({layer.type}) has no bottoms but comes after the first "
                    "layer with one: put the data layers first")
        if not getattr(layer, "capturable", True):
            return (f"cuda_graph: layer '{layer.name}' ({layer.type}) cannot be recorded once and replayed "
                    "(it makes a new host-side choice every pass)")
    return None


def cuda_recorder(xp):
    """``record(fn) -> replay``: runs ``fn`` under stream capture into a private memory pool; ``replay()``
    launches the graph on the stream it was recorded on."""
    pool = xp.cuda.MemoryPool()

    def record(fn):
        stream = xp.cuda.get_current_stream()
        with xp.cuda.using_allocator(pool.malloc):
            stream.begin_capture()
            try:
                fn()
            except BaseException:
                with contextlib.suppress(Exception):  # the capture is invalid: end it, keep fn's error
                    stream.end_capture()
                raise
            graph = stream.end_capture()
        return lambda: graph.launch(stream)

    return record


class IterationGraphs:
    """Forward-backward of ``net`` with its body replayed from recorded graphs (see the module text).

    Args:
        net: a Net on cupy (``refusal(net, 1)`` is None).
        record: ``record(fn) -> replay`` (default :func:`cuda_recorder`); a stand-in lets the cut and the
            order of the ranges be tested on numpy.

    ``forward_backward()`` returns the loss like ``Net.forward_backward``. ``failed`` holds the reason once
    recording failed; from then on every pass runs eagerly.
    """

    def __init__(self, net, record=None):
        self.net = net
        self.lo, self.hi = body_range(net)
        self.record = record or cuda_recorder(net.xp)
        self.forward_graph = self.backward_graph = None
        self.failed = None
        self._current = None
        self._recorded, self._kept = None, []

    def _body_forward(self):
        for i in range(self.lo, self.hi + 1):
            self._current = i
            self.net.forward_layer(i)
        self._current = None

    def _body_backward(self):
        for i in range(self.hi, self.lo - 1, -1):
            self._current = i
            self.net.backward_layer(i)
        self._current = None

    def _fingerprint(self):
        """``(address, shape)`` of every data and diff array of the body's blobs, bottoms, tops and parameters."""
        net, out = self.net, []
        for i in range(self.lo, self.hi + 1):
            for blob in (*net.bottom_blobs(i), *net.top_blobs(i), *net.layers[i].blobs):
                for a in (blob.data, blob.diff):
                    out.append((data_address(a), tuple(a.shape)))
        return out

    def _replay(self, which, run):
        """Replay graph ``which`` (recording it first); eagerly when recording failed."""
        if self.failed is None and getattr(self, which) is None:
            from ..kernels.workspace import _ARENAS
            if which == "forward_graph":
                self._recorded, self._kept = self._fingerprint(), []
            self._kept += list(_ARENAS.values())  # the workspaces the graph writes: those before recording ...
            try:
                setattr(self, which, self.record(run))
                self._kept += list(_ARENAS.values())  # ... and those that grew during it
            except Exception as e:  # noqa: BLE001 - any capture error: log it once and train without graphs
                if self._current is None:
                    where = "the end of the recording"
                else:
                    layer = self.net.layers[self._current]
                    where = f"layer '{layer.name}' ({layer.type})"
                self.failed = f"{where}: {type(e).__name__}: {e}"
                self._kept = []
                log.warning("cuda_graph: cannot record the body at %s; training goes on without graphs",
                            self.failed)
        if self.failed is None:
            getattr(self, which)()
        else:
            run()

    def forward_backward(self):
        net, lo, hi = self.net, self.lo, self.hi
        if lo > 0:
            net.forward(end=lo - 1)
        if self.forward_graph is not None and self._fingerprint() != self._recorded:
            log.info("cuda_graph: a reshape moved the body's arrays; recording the graphs again")
            self.forward_graph = self.backward_graph = None
        self._replay("forward_graph", self._body_forward)
        net.forward(start=hi + 1)  # the losses: net.loss is theirs, the body has no loss weights
        loss = net.loss
        net.backward(start=hi + 1)
        self._replay("backward_graph", self._body_backward)
        if lo > 0:
            net.backward(end=lo - 1)
        return loss
