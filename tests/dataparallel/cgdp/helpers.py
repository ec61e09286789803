"""A deterministic data-parallel problem: an LMDB written here, and solver dicts for G workers or one worker.

The Data layer shards records ``g, g + G, ...`` (no shuffling), so the first batches of G workers with batch
b hold exactly records 0 .. G*b - 1, the first batch of one worker with batch G*b; with losses normalised by
the batch, the mean of the G gradients is the single worker's gradient.
"""
import numpy

from layerforge.data.lmdb_io import LMDBWriter

C, H, W, CLASSES = 2, 3, 3, 3


def write_lmdb(path, n=48, seed=0):
    r = numpy.random.default_rng(seed)
    with LMDBWriter(str(path)) as w:
        for i in range(n):
            w.add(r.standard_normal((C, H, W)).astype(numpy.float32), int(r.integers(CLASSES)))
    return str(path)


def net(source, batch, frozen=False):
    """conv (params) -> relu, pool (none) -> ip1 (params) -> relu -> ip2 .. ip5 (params) -> loss.

    ``frozen`` gives ip1 lr_mult 0 and adds a parameter-free chain, for the empty/no-parameter cases.
    """
    fill = {"type": "gaussian", "std": 0.3}
    layers = [
        {"name": "data", "type": "Data", "top": ["data", "label"],
         "data": {"source": source, "batch_size": batch, "shuffle": False, "prefetch": 0}},
        {"name": "conv", "type": "Convolution", "bottom": "data", "top": "conv",
         "convolution": {"num_output": 4, "kernel_size": 2, "weight_filler": fill,
                         "bias_filler": {"type": "constant", "value": 0.1}}},
        {"name": "relu0", "type": "ReLU", "bottom": "conv", "top": "conv"},
        {"name": "pool", "type": "Pooling", "bottom": "conv", "top": "pool",
         "pooling": {"pool": "MAX", "kernel_size": 2, "stride": 1}},
        {"name": "ip1", "type": "InnerProduct", "bottom": "pool", "top": "ip1",
         "inner_product": {"num_output": 5, "weight_filler": fill, "bias_filler": fill}},
        {"name": "relu1", "type": "ReLU", "bottom": "ip1", "top": "ip1"},
    ]
    bottom = "ip1"
    for k in range(2, 6):  # enough layers with parameters for chunks of 3 beside the tail
        layers.append({"name": f"ip{k}", "type": "InnerProduct", "bottom": bottom, "top": f"ip{k}",
                       "inner_product": {"num_output": CLASSES if k == 5 else 4, "weight_filler": fill,
                                         "bias_filler": fill}})
        bottom = f"ip{k}"
    layers.append({"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip5", "label"], "top": "loss"})
    if frozen:
        layers[4]["param"] = [{"lr_mult": 0}, {"lr_mult": 0}]
        layers.insert(6, {"name": "sig", "type": "Sigmoid", "bottom": "ip1", "top": "sig"})
        layers[7]["bottom"] = "sig"
    return {"name": "tiny", "layers": layers}


def solver(source, batch, max_iter=4, frozen=False, **keys):
    d = {"net_param": net(source, batch, frozen), "type": "SGD", "base_lr": 0.1, "momentum": 0.9,
         "weight_decay": 0.01, "max_iter": max_iter, "dtype": "float64", "random_seed": 3,
         "snapshot_after_train": False}
    d.update(keys)
    return d


def flat_params(solver):
    """The learnable parameters of a solver's net (on the host or a device), flattened in the workers' layout
    (backward order), as a numpy array."""
    from layerforge.backend import to_numpy
    from layerforge.dataparallel.cgdp.chunks import param_units

    net = solver.net
    return numpy.concatenate([to_numpy(net.learnable_params[k].data).ravel() for u in param_units(net)
                              for k in u.params])


def die_on_worker_1(g, solver):
    """WorkerOptions.setup for the failure test: worker 1 leaves abruptly after its second iteration."""
    import os

    if g == 1:
        solver.add_callback(lambda iteration, loss: os._exit(7) if iteration == 1 else None)


def bad_record_on_worker_1(g, solver):
    """WorkerOptions.setup: worker 1 meets the user's error (a DataError) in its second iteration."""
    from layerforge.errors import DataError

    def fail(iteration, loss):
        if iteration == 1:
            raise DataError("db: key '00000042': corrupted record")

    if g == 1:
        solver.add_callback(fail)


def bug_on_worker_1(g, solver):
    """WorkerOptions.setup: worker 1 crashes (a Python exception no user input explains, its text on two lines) in
    its second iteration."""
    def crash(iteration, loss):
        if iteration == 1:
            raise RuntimeError("a bug\nover two lines")

    if g == 1:
        solver.add_callback(crash)


# a net of 3 layers with parameters on 4 samples of DummyData, for runs of `layerforge` commands
SMALL_NET = """
name: small
layers:
  - {name: data, type: DummyData, top: [data, label],
     dummy_data: {shape: [[4, 3, 12, 12], [4]], data_filler: [{type: gaussian}, {type: constant}]}}
  - {name: conv1, type: Convolution, bottom: data, top: conv1,
     convolution: {num_output: 8, kernel_size: 3, weight_filler: {type: xavier}}}
  - {name: relu1, type: ReLU, bottom: conv1, top: conv1}
  - {name: ip1, type: InnerProduct, bottom: conv1, top: ip1,
     inner_product: {num_output: 32, weight_filler: {type: xavier}}}
  - {name: ip2, type: InnerProduct, bottom: ip1, top: ip2,
     inner_product: {num_output: 5, weight_filler: {type: xavier}}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip2, label], top: loss}
"""


def report_threads(g, solver):
    """WorkerOptions.setup: stop the job with a line saying the worker's BLAS / kernel threads and its setting."""
    import os

    from layerforge.errors import ConfigError
    from layerforge.kernels.threadpool import num_threads

    raise ConfigError(f"worker {g}: {num_threads()} threads, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
