"""HDF5 layers: ``HDF5Data`` reads the datasets of a list of .h5 files, ``HDF5Output`` writes its bottoms to one."""
import itertools
import os
import weakref

import numpy

from .. import rng
from ..backend import to_numpy
from ..caffe.hdf5 import stored
from ..data import read_text
from ..data.batches import BatchStream
from ..data.device_feed import DeviceFeed
from ..data.transform import resolve_path
from ..errors import DataError, ShapeError
from ..schema import REQUIRED
from .base import Field, Layer, register_layer
from .data import COMMON, BaseData, close_feeds


def read_file_list(source):
    """The .h5 paths listed in ``source``, one per line, each resolved against the working directory, then
    against the list file's own folder (Caffe only tries the first)."""
    path = resolve_path(source)
    names = [line.strip() for line in read_text(path, "HDF5 file list", shown=source).splitlines() if line.strip()]
    if not names:
        raise DataError(f"{source}: the HDF5 file list names no files")
    here = os.path.dirname(os.path.abspath(path))
    return [name if os.path.isabs(name) or os.path.exists(name) else os.path.join(here, name) for name in names]


def load_hdf5_rows(filename, datasets, dtype):
    """``[array, ...]``, one per dataset name, all with the same number of rows (axis 0)."""
    import h5py
    try:
        with h5py.File(filename, "r") as f:
            arrays = []
            for name in datasets:
                ds = stored(f, name, filename, DataError)
                if not isinstance(ds, h5py.Dataset):
                    found = ", ".join(k for k in f.keys()) or "none"
                    raise DataError(f"{filename}: no dataset '{name}' (datasets: {found})")
                if ds.ndim < 1:
                    raise DataError(f"{filename}: dataset '{name}' is a scalar; it needs at least one axis (rows)")
                if 0 in ds.shape[1:]:
                    raise DataError(f"{filename}: dataset '{name}' has rows of shape {ds.shape[1:]}, which hold "
                                    f"no values")
                try:
                    arrays.append(numpy.asarray(ds[...], dtype=dtype))
                except (TypeError, ValueError) as e:
                    raise DataError(f"{filename}: dataset '{name}' cannot be read as numbers: {e}") from None
    except OSError as e:
        raise DataError(f"{filename}: cannot read the HDF5 file: {e}") from None
    for name, array in zip(datasets[1:], arrays[1:]):
        if len(array) != len(arrays[0]):
            raise DataError(f"{filename}: dataset '{name}' has {len(array)} rows but '{datasets[0]}' has "
                            f"{len(arrays[0])}")
    return arrays


class FileBlockStream(BatchStream):
    """A BatchStream over rows held in memory, kept in blocks of one file each.

    With ``shuffle`` each epoch draws a file order and, within every file, a row order, so a file's rows
    are read together, as Caffe's HDF5Data reads them. Rank ``r`` of ``world_size`` reads every
    ``world_size``-th row of the epoch's order, starting at ``r`` (disjoint shards within an epoch).
    """

    def __init__(self, arrays, rows_per_file, batch_size, shuffle, seed, rank=0, world_size=1):
        super().__init__(None, len(arrays[0]), batch_size, None, shuffle, seed, rank, world_size)
        self.arrays, self.rank, self.world_size = arrays, rank, world_size
        self.rows_per_file = numpy.asarray(rows_per_file)
        self.first_row = numpy.concatenate([[0], numpy.cumsum(self.rows_per_file)[:-1]])

    def order(self, epoch):
        if epoch != self._epoch:
            if self.shuffle:
                r = numpy.random.default_rng([self.seed, 0, epoch])
                full = numpy.concatenate([self.first_row[k] + r.permutation(self.rows_per_file[k])
                                          for k in r.permutation(len(self.rows_per_file))])
            else:
                full = numpy.arange(len(self.arrays[0]))
            self._order, self._epoch = full[self.rank::self.world_size], epoch
        return self._order

    def batch(self, position):
        rows = numpy.asarray(self.indices(position, self.batch_size))
        return [array[rows] for array in self.arrays]


@register_layer("HDF5Data")
class HDF5Data(Layer):
    """Reads the datasets named by its tops from the HDF5 files listed in ``source``.

    Top ``k`` (N, d1, ...) holds rows of the dataset named like the top (``top: [data, label]`` reads the
    datasets ``data`` and ``label``), N = batch_size, (d1, ...) the dataset's shape after its first axis;
    values are cast to the layer's dtype. Rows of all listed files are concatenated (all files are held in
    memory) and read in order, wrapping around at the end; ``shuffle`` draws, each epoch, a new file
    order and a new row order within each file. A relative path in the list resolves against the working
    directory (as in Caffe), then against the list file's folder. No transform: the data are used as stored.
    """

    num_bottom = (0, 0)
    num_top = (1, None)
    backward_reads = ()
    has_backward = False
    block = "hdf5_data"
    param_blocks = {
        "hdf5_data": {
            "source": Field("str", REQUIRED, doc="a text file listing .h5 files, one per line"),
            "batch_size": Field("int", REQUIRED, min=1, doc="rows per batch"),
            "shuffle": Field("bool", False, doc="each epoch: shuffle the file order and the rows within each file"),
            "rank": COMMON["rank"],
            "world_size": COMMON["world_size"],
        },
    }
    validate_params = classmethod(BaseData.validate_params.__func__)

    def layer_setup(self, bottom, top):
        p = self.layer_param.hdf5_data
        try:
            arrays, rows_per_file = self.load(p.source, list(self.layer_param.top))
            self.stream = FileBlockStream(arrays, rows_per_file, p.batch_size, p.shuffle,
                                          rng.get_rng().integers(2 ** 63), p.rank, p.world_size)
        except DataError as e:
            raise DataError(f"layer '{self.name}' (HDF5Data): hdf5_data.source '{p.source}': {e}") from None
        self.batch_size = p.batch_size
        self._feeds = []  # at most one DeviceFeed from the read position, made at the first forward
        weakref.finalize(self, close_feeds, self._feeds)  # a dropped layer's pending copy ends before its blocks free

    def load(self, source, names):
        """The listed files' datasets ``names``, each concatenated over the files, and each file's row count."""
        per_file = []
        for filename in read_file_list(source):
            arrays = load_hdf5_rows(filename, names, self.dtype)
            for name, array, first in zip(names, arrays, per_file[0] if per_file else arrays):
                if array.shape[1:] != first.shape[1:]:
                    raise DataError(f"{filename}: dataset '{name}' has rows of shape {array.shape[1:]}, "
                                    f"the first file's have {first.shape[1:]}")
            per_file.append(arrays)
        return [numpy.concatenate(column) for column in zip(*per_file)], [len(a[0]) for a in per_file]

    def reshape(self, bottom, top):
        for t, array in zip(top, self.stream.arrays):
            t.reshape((self.batch_size,) + array.shape[1:])

    def forward(self, bottom, top):
        if not self._feeds:
            positions = itertools.count(self.stream.position, self.batch_size)
            self._feeds.append(DeviceFeed(self.xp, ((self.stream.batch(p), None) for p in positions)))
        self._feeds[0].next_into([t.data for t in top])
        self.stream.position += self.batch_size

    def backward(self, top, propagate_down, bottom):
        pass

    def get_state(self):
        """The read position and shuffle seed: a JSON-able dict for snapshots."""
        return dict(self.stream.get_state(), type=self.type)

    def set_state(self, state):
        self.stream.set_state(state)
        self.close()

    def close(self):
        """Drop the batch staged on the device (the next forward stages again from the read position)."""
        close_feeds(self._feeds)


@register_layer("HDF5Output")
class HDF5Output(Layer):
    """Appends its two bottoms to the datasets ``data`` and ``label`` of the HDF5 file ``file_name``.

    Bottoms: (N, ...) and (M, ...), any shapes; each forward appends their rows (as float32, the dtype
    Caffe writes) to the datasets, which grow along axis 0. The file is created (or emptied) at setup.
    No tops, no gradient.
    """

    num_bottom = (2, 2)
    num_top = (0, 0)
    backward_reads = ()
    has_backward = False
    datasets = ("data", "label")  # Caffe's HDF5_DATA_DATASET_NAME and HDF5_DATA_LABEL_NAME
    param_blocks = {
        "hdf5_output": {"file_name": Field("str", REQUIRED, doc="the .h5 file written")},
    }

    def layer_setup(self, bottom, top):
        import h5py
        self.reshape(bottom, top)
        self.file_name = self.layer_param.hdf5_output.file_name
        try:
            with h5py.File(self.file_name, "w") as f:
                for name, b in zip(self.datasets, bottom):
                    f.create_dataset(name, shape=(0,) + tuple(b.shape[1:]), maxshape=(None,) + tuple(b.shape[1:]),
                                     dtype=numpy.float32, chunks=True)
        except OSError as e:
            raise DataError(f"layer '{self.name}' (HDF5Output): cannot create '{self.file_name}': {e}") from None

    def reshape(self, bottom, top):
        if bottom[0].data.ndim == 0 or bottom[1].data.ndim == 0 or bottom[0].num != bottom[1].num:
            raise ShapeError(f"bottoms 'data' {tuple(bottom[0].shape)} and 'label' {tuple(bottom[1].shape)} need "
                             "the same number of rows (axis 0)", "bottom")

    def forward(self, bottom, top):
        import h5py
        with h5py.File(self.file_name, "a") as f:
            for name, b in zip(self.datasets, bottom):
                ds = f[name]
                if tuple(b.shape[1:]) != ds.shape[1:]:
                    raise DataError(f"layer '{self.name}' (HDF5Output): bottom '{name}' rows have shape "
                                    f"{tuple(b.shape[1:])}, the file's dataset has {ds.shape[1:]}")
                n = ds.shape[0]
                ds.resize(n + b.shape[0], axis=0)
                ds[n:] = to_numpy(b.data).astype(numpy.float32)

    def backward(self, top, propagate_down, bottom):
        pass
