"""Which records make up each batch: epochs, reshuffling, sharding and an exact read position.

Record positions count the records a consumer has taken from its shard; position p reads record
``shard[order(p // len(shard))[p % len(shard)]]``, where ``shard`` is ``range(rank, n, world_size)`` (so
shards are disjoint and together cover the database) and ``order(e)`` is the identity or, with
shuffling, a permutation drawn from ``seed`` and the epoch e. The random crops and mirrors of the batch
starting at position p are drawn from ``seed`` and p. A batch is thus a pure function of
``(seed, position)``: decode workers may run ahead freely, in any number, and ``get_state`` / ``set_state``
need only those two numbers to resume exactly.
"""
import numpy

from ..errors import DataError


class BatchStream:
    """Which records, crops and mirrors make up each batch, and how one record is put into it.

    A batch is made in three steps: :meth:`plan` (here, from the seed and the position), :meth:`fill` for each
    record (in a decode worker: read, decode, crop into the batch's host arrays) and :meth:`finish` (mean and
    scale, on the device that computes).

    Args:
        read: ``read(index) -> (array (C, H, W), label)`` over the whole source.
        size: number of records in the source.
        batch_size: records per batch; a batch running past the end of an epoch continues in the next.
        transform: a DataTransformer.
        shuffle: draw a new record order every epoch.
        seed: a non-negative int from which all of this stream's randomness derives.
        rank, world_size: read only the shard ``range(rank, size, world_size)``.
        shape, dtype: the (C, H, W) and dtype every record must have (the first record's).
        name_of: ``name_of(index)`` names a record in error messages (its key, or file and line).
    """

    def __init__(self, read, size, batch_size, transform, shuffle, seed, rank=0, world_size=1,
                 shape=None, name_of=str, dtype=numpy.uint8):
        self.read, self.batch_size, self.transform = read, batch_size, transform
        self.shuffle, self.seed, self.name_of = shuffle, int(seed), name_of
        self.shape, self.dtype = None if shape is None else tuple(shape), numpy.dtype(dtype)
        self.shard = numpy.arange(rank, size, world_size)
        if len(self.shard) == 0:
            raise DataError(f"shard {rank} of {world_size} is empty: the source has only {size} records")
        self.position = 0
        self._epoch, self._order = None, None

    def order(self, epoch):
        """Record indices of ``epoch`` in reading order."""
        if epoch != self._epoch:
            self._order = (numpy.random.default_rng([self.seed, 0, epoch]).permutation(self.shard)
                           if self.shuffle else self.shard)
            self._epoch = epoch
        return self._order

    def indices(self, position, count):
        n = len(self.shard)
        return [int(self.order(p // n)[p % n]) for p in range(position, position + count)]

    def layout(self):
        """``[(shape, dtype), ...]`` of a batch's host arrays: the crops (N, C, h, w) in the records' dtype and
        the labels (N,)."""
        n = self.batch_size
        return [((n,) + self.transform.output_shape(self.shape), self.dtype), ((n,), numpy.float64)]

    def plan(self, position):
        """The batch starting at record ``position``: ``(items, crops)``; ``items`` lists, per image i, the tuple
        ``(i, record index, h0, w0, flip)`` :meth:`fill` takes, and ``crops`` is the transform's
        ``(h0, w0, flip)`` that :meth:`finish` takes."""
        crops = self.transform.plan(self.batch_size, self.shape, numpy.random.default_rng([self.seed, 1, position]))
        indices = self.indices(position, self.batch_size)
        return list(zip(range(self.batch_size), indices, *(a.tolist() for a in crops))), crops

    def fill(self, arrays, item):
        """Read record ``item`` (a tuple of :meth:`plan`'s), check it and crop it into ``arrays`` (the batch's
        host arrays, :meth:`layout`)."""
        i, index, h0, w0, flip = item
        array, label = self.read(index)
        self.check(index, array)
        self.transform.crop_into(arrays[0][i], array, h0, w0, flip)
        arrays[1][i] = label

    def check(self, index, array):
        """DataError naming record ``index`` when ``array`` differs in shape or dtype from the first record."""
        if array.shape != self.shape:
            raise DataError(f"{self.name_of(index)}: shape {array.shape} differs from the first record's "
                            f"{self.shape}; all records of a source must have one shape")
        if array.dtype != self.dtype:
            raise DataError(f"{self.name_of(index)}: {array.dtype} values, the first record has {self.dtype}; "
                            "all records of a source must have one kind of values")

    def describe(self, item):
        """The name of the record of ``item`` (its key, or file and line)."""
        return self.name_of(item[1])

    def finish(self, xp, arrays, crops, outs):
        """The tops ``outs`` (data, and labels when asked) from a filled batch's arrays, on ``xp``."""
        self.transform.finish(xp, arrays[0], crops, outs[0])
        if len(outs) > 1:
            outs[1][...] = arrays[1]

    def get_state(self):
        return {"seed": self.seed, "position": int(self.position)}

    def set_state(self, state):
        self.seed, self.position = int(state["seed"]), int(state["position"])
        self._epoch = None
