"""The solver file's keys: Caffe's SolverParameter fields (same names, same defaults) and layerforge's own.

docs/solvers.md lists them. ``SOLVER_KEYS`` drives both the YAML validation (param.py) and the reading of a
Caffe solver prototxt (caffe_solver.py), so a key added here is understood in both formats.
"""
from ..schema import Field

STATE = {
    "level": Field("int", 0, doc="NetState level for include/exclude rules"),
    "stage": Field("strs", [], doc="NetState stages for include/exclude rules"),
}

INLINE_KEYS = ("net_param", "train_net_param", "test_net_param")
LR_POLICIES = ("FIXED", "STEP", "EXP", "INV", "MULTISTEP", "POLY", "SIGMOID")

SOLVER_KEYS = {
    # nets
    "net": Field("str", None, doc="net YAML used for training and (with test_iter) testing; relative to this file"),
    "net_param": Field("str", None, doc="the net definition inline (a mapping)"),
    "train_net": Field("str", None, doc="net YAML for training only"),
    "train_net_param": Field("str", None, doc="the training net inline (a mapping)"),
    "test_net": Field("strs", [], doc="net YAML(s) for testing, one per test net"),
    "test_net_param": Field("str", None, doc="test net definitions inline (a mapping or a list of them)"),
    "train_state": Field(STATE, None, doc="level/stage of the training net"),
    "test_state": Field([STATE], [], doc="level/stage of each test net"),
    # update rule
    "type": Field("str", "SGD", doc="SGD, Nesterov, AdaGrad, RMSProp, AdaDelta or Adam"),
    "base_lr": Field("float", 0.01, min=0.0, doc="base learning rate"),
    "lr_policy": Field("enum", "FIXED", choices=LR_POLICIES, doc="learning-rate schedule"),
    "gamma": Field("float", None, doc="step/exp/inv/multistep/sigmoid parameter"),
    "power": Field("float", None, doc="inv/poly parameter"),
    "stepsize": Field("int", None, min=1, doc="step: iterations per step; sigmoid: centre"),
    "stepvalue": Field("ints", [], min=0, doc="multistep: increasing iterations at which lr *= gamma"),
    "warmup_iter": Field("int", 0, min=0, doc="linear warm-up length in iterations (Goyal et al.)"),
    "warmup_start_lr_factor": Field("float", 0.0, min=0.0, max=1.0, doc="warm-up starts at this fraction of lr"),
    "momentum": Field("float", 0.0, min=0.0, doc="SGD/Nesterov momentum; AdaDelta decay; Adam beta1"),
    "momentum2": Field("float", 0.999, min=0.0, max=1.0, doc="Adam beta2"),
    "delta": Field("float", 1e-8, min=0.0, doc="AdaGrad/RMSProp/AdaDelta/Adam epsilon"),
    "rms_decay": Field("float", 0.99, min=0.0, max=1.0, doc="RMSProp decay of the squared-gradient average"),
    "weight_decay": Field("float", 0.0, min=0.0, doc="regularisation strength (times each param's decay_mult)"),
    "regularization_type": Field("enum", "L2", choices=("L2", "L1"), doc="L2: += wd * w; L1: += wd * sign(w)"),
    "iter_size": Field("int", 1, min=1, doc="forward/backward passes accumulated per update"),
    "clip_gradients": Field("float", -1.0, doc="scale diffs down to this global L2 norm (< 0: off)"),
    "clip_after_normalize": Field("bool", False, doc="clip the mean gradient of the iter_size passes, not their "
                                                     "sum as Caffe does (the threshold then means the same for "
                                                     "every iter_size)"),
    "sparse_update": Field("enum", "EXACT", choices=("EXACT", "LAZY"),
                           doc="parameters with row gradients (Embed): exact updates every row as the dense "
                               "rule does; lazy updates (decay, history, weights) only the rows with a gradient"),
    # loop, logging, testing
    "max_iter": Field("int", 0, min=0, doc="iterations to train"),
    "display": Field("int", 0, min=0, doc="log every this many iterations (0: never)"),
    "average_loss": Field("int", 1, min=1, doc="the displayed loss is the mean over this many iterations"),
    "test_iter": Field("ints", [], min=1, doc="batches per test, one entry per test net"),
    "test_interval": Field("int", 0, min=0, doc="test every this many iterations (0: never)"),
    "test_initialization": Field("bool", True, doc="also test before the first iteration"),
    "test_compute_loss": Field("bool", False, doc="log the mean test loss too"),
    "eval_type": Field("enum", "CLASSIFICATION", choices=("CLASSIFICATION", "DETECTION"),
                       doc="the SSD fork's: DETECTION logs each test output's mAP (DetectionEvaluate's rows) instead "
                           "of its mean"),
    "ap_version": Field("str", "Integral", doc="DETECTION: 11point (VOC2007), MaxIntegral (VOC2012) or Integral"),
    "show_per_class_result": Field("bool", False, doc="DETECTION: log each class's AP too"),
    "report_perplexity": Field("bool", False, doc="log exp(loss output) next to each loss output, train and "
                                                  "test (language models: the loss is the per-token cross "
                                                  "entropy, exp of it the perplexity)"),
    # snapshots
    "snapshot": Field("int", 0, min=0, doc="snapshot every this many iterations (0: never)"),
    "snapshot_prefix": Field("str", None, doc="path prefix of snapshot files, relative to the working directory"),
    "snapshot_after_train": Field("bool", True, doc="snapshot when training ends (or is stopped)"),
    "snapshot_format": Field("enum", "NPZ", choices=("NPZ", "BINARYPROTO", "HDF5"),
                             doc="NPZ: layerforge's .npz (resumes exactly); BINARYPROTO / HDF5: Caffe's files"),
    "weights": Field("strs", [], doc="weights file(s) to start from (copied by layer name; relative to the cwd)"),
    # telemetry (docs/trace.md)
    "trace": Field("str", None, doc="record a Chrome / Perfetto trace of the trace_iterations into this file "
                                    "(relative to the working directory; --trace overrides)"),
    "trace_iterations": Field("str", "5:10", doc="iterations A:B (A to B-1) that go into the trace; 'A:' or all"),
    "tensorboard": Field("str", None, doc="write TensorBoard scalars to this folder (--tensorboard overrides)"),
    # environment
    "random_seed": Field("int", -1, doc="seed of the process random stream (< 0: leave it as it is)"),
    "solver_mode": Field("enum", "CPU", choices=("CPU", "GPU")),
    "device_id": Field("int", 0, min=0, doc="GPU ordinal in GPU mode"),
    "dtype": Field("enum", "FLOAT32", choices=("FLOAT32", "FLOAT64"), doc="dtype of every blob"),
    "cuda_graph": Field("bool", False, doc="GPU: record the layers between the data layers and the first loss as "
                                           "CUDA graphs once AUTO has settled, and replay them (docs/gpu.md)"),
    "gemm_precision": Field("enum", None, choices=("FP32", "TF32", "FP16", "BF16"),
                            doc="float32 matrix products: strict FP32, TF32 (GPU), or operands rounded to FP16 / "
                                "BF16 with FP32 accumulation (the process-wide switch of kernels.blas; not given: "
                                "LAYERFORGE_GEMM_PRECISION or FP32)"),
    # reserved for data-parallel training
    "allreduce": Field("enum", "AUTO", choices=("AUTO", "RECURSIVE", "TOPOLOGY", "RING", "DOUBLING", "HIERARCHICAL",
                                                 "MPI", "NCCL"),
                       doc="gradient allreduce algorithm (distributed training)"),
    "allreduce_bucket_mb": Field("float", 4.0, min=0.0,
                                 doc="pack gradients into buckets of at most this many MiB, which overlap sends "
                                     "one by one during backward (0: one buffer)"),
    "allreduce_fp16": Field("bool", False, doc="send gradients as float16 (halves the bytes, rounds them)"),
    "allreduce_overlap": Field("bool", True, doc="under mpiexec, send each gradient bucket while backward computes "
                                                 "the rest (same result as sending after backward)"),
    "double_buffering": Field("bool", False, doc="ChainerMN's double buffering: update with the previous "
                                                 "iteration's averaged gradients, communication fully hidden (a "
                                                 "different optimiser: gradients one step stale; iteration 0 "
                                                 "makes no update)"),
    "sparse_aggregation": Field("enum", "AUTO", choices=("DENSE", "ALLGATHER", "SHARDED", "AUTO"),
                                doc="how row gradients (Embed) are summed across ranks: as dense arrays in the "
                                    "allreduce, allgather of the rows, Parallax's sharded exchange, or the one "
                                    "the cost model picks from the measured density"),
    "group_size": Field("int", 0, min=0, doc="ranks per node group for the topology-aware allreduce "
                                              "(0: discover shared-memory nodes)"),
    "collective_timeout": Field("float", 600.0, min=0.0,
                                doc="seconds a collective, or a wait on another rank, CPU replica or worker, may "
                                    "last from the first one's arrival before the job ends naming the late one; "
                                    "it is named in the log after a few seconds (0: no deadline; "
                                    "--collective-timeout overrides; docs/distributed.md)"),
    "sync": Field("enum", "TREE", choices=("TREE", "HOST"), doc="how ranks synchronise (distributed training)"),
    "max_restarts": Field("int", 0, min=0, doc="layerforge train: restart the job from its last snapshot when a rank "
                                               "(or the one process) dies, up to this many times (--max-restarts "
                                               "overrides; docs/distributed.md)"),
    "cpu_parallel": Field("enum", "AUTO", choices=("AUTO", "THREADS", "REPLICAS"),
                          doc="how a CPU run uses the cores: one process whose BLAS and kernels use every core "
                              "(THREADS), one single-threaded replica per core each on batch/cores, equal to one "
                              "process to float rounding (REPLICAS), or the faster of the two for this net, batch "
                              "and machine by a short timed trial, remembered (AUTO, the default; "
                              "docs/performance.md)"),
    # several workers/devices on one host (layerforge/dataparallel/cgdp, docs/cgdp.md)
    "chunk_size": Field("str", "1", doc="sync host: layers with parameters per gradient chunk (an int), or auto"),
    "chunk_search_interval": Field("int", 10, min=2, doc="chunk_size auto: iterations timed per tried size"),
    "chunk_search_step": Field("int", 1, min=1, doc="chunk_size auto: size increment between tries"),
    "chunk_search_range": Field("int", 3, min=1, doc="chunk_size auto: stop after this many tries without gain"),
}
