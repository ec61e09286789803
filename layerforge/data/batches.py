"""Which records make up each batch: epochs, reshuffling, sharding and an exact read position.

Record positions count the records a consumer has taken from its shard; position p reads record
``shard[order(p // len(shard))[p % len(shard)]]``, where ``shard`` is ``range(rank, n, world_size)`` (so
shards are disjoint and together cover the database) and ``order(e)`` is the identity or, with
shuffling, a permutation drawn from ``seed`` and the epoch e. The random crops and mirrors of the batch
starting at position p are drawn from ``seed`` and p. A batch is thus a pure function of
``(seed, position)``: a background thread may run ahead freely, and ``get_state`` / ``set_state`` need
only those two numbers to resume exactly.
"""
import numpy

from ..errors import DataError


class BatchStream:
    """Produces ``(data, labels)`` batches from a record source.

    Args:
        read_many: ``read_many(indices) -> [(array (C, H, W), label), ...]`` over the whole source.
        size: number of records in the source.
        batch_size: records per batch; a batch running past the end of an epoch continues in the next.
        transform: a DataTransformer (or any ``f(batch, rng) -> array``).
        shuffle: draw a new record order every epoch.
        seed: a non-negative int from which all of this stream's randomness derives.
        rank, world_size: read only the shard ``range(rank, size, world_size)``.
        shape: the (C, H, W) every record must have.
        name_of: ``name_of(index)`` names a record in error messages (its key, or file and line).
    """

    def __init__(self, read_many, size, batch_size, transform, shuffle, seed, rank=0, world_size=1,
                 shape=None, name_of=str):
        self.read_many, self.batch_size, self.transform = read_many, batch_size, transform
        self.shuffle, self.seed, self.shape, self.name_of = shuffle, int(seed), shape, name_of
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

    def batch(self, position):
        """The batch starting at record ``position``: data (N, C, h, w) and labels (N,)."""
        indices = self.indices(position, self.batch_size)
        records = self.read_many(indices)
        for index, (array, _) in zip(indices, records):
            if self.shape is not None and array.shape != tuple(self.shape):
                raise DataError(f"{self.name_of(index)}: shape {array.shape} differs from the first record's "
                                f"{tuple(self.shape)}; all records of a source must have one shape")
        data = numpy.stack([array for array, _ in records])
        labels = numpy.array([label for _, label in records])
        data = self.transform(data, numpy.random.default_rng([self.seed, 1, position]))
        return data, labels

    def get_state(self):
        return {"seed": self.seed, "position": int(self.position)}

    def set_state(self, state):
        self.seed, self.position = int(state["seed"]), int(state["position"])
        self._epoch = None

