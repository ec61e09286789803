"""TokenData: a token stream cut into truncated-BPTT batches for recurrent language models.

The token ids (the stdlib corpus, layerforge.data.pycorpus, or an .npy file of ids) are split into
``S = batch_size * world_size`` contiguous streams of ``L // S`` tokens (the tail is dropped); this rank
reads streams ``rank * batch_size ...``, one per batch column. Each forward takes the next ``time_steps``
positions ``t0 .. t0 + T - 1`` of every stream and writes, all (T, N) in the net's dtype:

    tokens[t, n] = stream_n[t0 + t],   next[t, n] = stream_n[t0 + t + 1],   cont[t, n] = 0 if t0 + t == 0 else 1

``cont`` is Caffe's sequence-continuation marker for RNN/LSTM (0 resets the state). When fewer than T + 1
positions are left, the streams start again at position 0 (cont 0). Splitting streams, not positions, across
ranks makes P ranks x batch b read exactly the columns of one rank x batch P*b. The read position is saved
in snapshots (``get_state``), so a resumed run reads on where it stopped.
"""
import numpy

from ..data import pycorpus
from ..errors import DataError
from .base import Field, Layer, register_layer

CORPORA = ("pycorpus",)


@register_layer("TokenData")
class TokenData(Layer):
    """Tops ``tokens``, ``cont`` and ``next`` (T, N) from a token-id stream (module docstring)."""

    num_bottom = (0, 0)
    num_top = (3, 3)
    backward_reads = ()
    has_backward = False
    param_blocks = {
        "token_data": {
            "corpus": Field("str", None, doc="a built-in corpus: pycorpus (the Python standard library's tokens)"),
            "source": Field("str", None, doc="or an .npy file of non-negative integer token ids"),
            "split": Field("str", "train", doc="pycorpus part: train or heldout"),
            "vocabulary": Field("int", 10000, min=2, doc="pycorpus vocabulary size, <unk> included"),
            "time_steps": Field("int", 20, min=1, doc="T: positions per batch (truncated BPTT length)"),
            "batch_size": Field("int", 16, min=1, doc="N: streams this rank reads"),
            "rank": Field("int", 0, min=0, doc="read streams of shard `rank` of `world_size`"),
            "world_size": Field("int", 1, min=1, doc="shards the streams are split into (MPI ranks)"),
        },
    }

    @classmethod
    def validate_params(cls, lp):
        p = lp.token_data
        if (p.corpus is None) == (p.source is None):
            raise lp.error("give exactly one of corpus (pycorpus) and source (an .npy file of token ids)",
                           "token_data.corpus" if p.corpus is not None else "token_data")
        if p.corpus is not None and p.corpus not in CORPORA:
            raise lp.error(f"corpus '{p.corpus}' is not one of {', '.join(CORPORA)}", "token_data.corpus")
        if p.split not in ("train", "heldout"):
            raise lp.error(f"split '{p.split}' is not one of train, heldout", "token_data.split")
        if p.rank >= p.world_size:
            raise lp.error(f"rank {p.rank} must be less than world_size {p.world_size}", "token_data.rank")

    def layer_setup(self, bottom, top):
        p = self.layer_param.token_data
        ids = self._load(p)
        streams = p.batch_size * p.world_size
        length = len(ids) // streams
        if length < p.time_steps + 1:
            raise DataError(f"layer '{self.name}' (TokenData): {len(ids)} tokens make {streams} streams of "
                            f"{length}, fewer than time_steps + 1 = {p.time_steps + 1}; lower batch_size or "
                            "time_steps")
        first = p.rank * p.batch_size
        # (N, length) columns of this rank: stream s is ids[s * length : (s + 1) * length]
        self.streams = ids[first * length:(first + p.batch_size) * length].reshape(p.batch_size, length)
        self.time_steps, self.batch_size, self.position = p.time_steps, p.batch_size, 0

    def _load(self, p):
        if p.corpus == "pycorpus":
            ids, self.meta = pycorpus.load(p.split, p.vocabulary)
            return ids
        self.meta = {}
        try:
            ids = numpy.load(p.source, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise DataError(f"layer '{self.name}' (TokenData): token_data.source '{p.source}': cannot read it as "
                            f"an .npy array ({e})") from None
        if ids.ndim != 1 or ids.dtype.kind not in "iu" or (ids.size and ids.min() < 0):
            raise DataError(f"layer '{self.name}' (TokenData): token_data.source '{p.source}' must hold a 1-d "
                            f"array of non-negative integers, got {ids.dtype} {ids.shape}")
        return ids

    def reshape(self, bottom, top):
        for t in top:
            t.reshape(self.time_steps, self.batch_size)

    def forward(self, bottom, top):
        T, length = self.time_steps, self.streams.shape[1]
        if self.position + T + 1 > length:
            self.position = 0
        window = self.streams[:, self.position:self.position + T + 1].T  # (T + 1, N)
        cont = numpy.ones((T, self.batch_size))
        if self.position == 0:
            cont[0] = 0
        for blob, values in zip(top, (window[:-1], cont, window[1:])):
            blob.data[...] = self.xp.asarray(values, dtype=blob.dtype)
        self.position += T

    def get_state(self):
        return {"type": self.type, "position": self.position}

    def set_state(self, state):
        self.position = int(state["position"])
