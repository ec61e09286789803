"""``layerforge test --model NET --weights W``: score a trained net on its TEST data (Caffe's ``caffe test``)."""
import logging

import numpy

from . import add_decode_workers, add_net_state, apply_decode_workers, net_state
from .. import backend
from ..errors import EndOfData, LayerforgeError
from ..kernels.autotune import forward_settled
from ..kernels.average_precision import AP_VERSIONS
from ..logs import setup_logging
from ..net.net import Net
from ..solvers.evaluation import add_up, caffe_float, output_weights
from ..schema import solvers_naming
from ..solvers import SOLVER_KEYS, SOLVER_REGISTRY, load_solver_param
from ..solvers.caffe_solver import read_solver_file

DEFAULT_AP_VERSION = SOLVER_KEYS["ap_version"].default  # the fork's SolverParameter default, Integral

HELP = "run a net's TEST phase for N batches with given weights and print per-batch and mean outputs"

log = logging.getLogger("layerforge")


def add_arguments(parser):
    add_decode_workers(parser)
    parser.add_argument("--model", required=True, help="the net (YAML, or Caffe's .prototxt)")
    parser.add_argument("--weights", required=True,
                        help="weights .npz (from training or a snapshot), or Caffe's .caffemodel / .caffemodel.h5")
    parser.add_argument("--iterations", type=int, default=50, help="number of batches (default 50)")
    parser.add_argument("--phase", choices=("train", "test"), default="test")
    parser.add_argument("--gpu", type=int, metavar="N", help="run the net on GPU N (Caffe's -gpu; default the CPU)")
    add_net_state(parser)
    parser.add_argument("--ap-version", "--ap_version", dest="ap_version", choices=AP_VERSIONS, default=None,
                        help="how the mAP of DetectionEvaluate outputs is computed (the SSD fork's ap_version); "
                             "default: the solver's (--solver, else a solver file beside the net that names it), so "
                             "the weights score as in the solver's test; without one Integral, the fork's default")
    parser.add_argument("--solver", help="the solver the weights were trained with: its ap_version scores "
                                         "DetectionEvaluate outputs (no other key of it is read)")


def ap_version_of(args):
    """``(ap_version, why)``: --ap-version, else the ap_version of --solver or of the first solver file beside
    --model that names it (schema.solvers_naming), else the fork's default (Integral)."""
    if args.ap_version:
        return args.ap_version, "--ap-version"
    if args.solver:
        return load_solver_param(args.solver, SOLVER_REGISTRY).ap_version, f"the ap_version of {args.solver}"
    for path in solvers_naming(args.model):
        try:
            mapping = read_solver_file(path)
        except LayerforgeError:
            continue
        value = mapping.get("ap_version", DEFAULT_AP_VERSION) if isinstance(mapping, dict) else None
        if value in AP_VERSIONS:
            return value, f"the ap_version of {path}, which names this net"
    return DEFAULT_AP_VERSION, "the SSD fork's default; --solver or --ap-version choose another"


def detection_outputs(net):
    """The names of ``net``'s outputs that DetectionEvaluate layers write (their rows make an mAP, not a mean)."""
    return {top for i, layer in enumerate(net.layers) if layer.type == "DetectionEvaluate"
            for top in net.top_names(i)} & set(net.outputs)


def score(net, iterations, ap_version="Integral"):
    """Run ``iterations`` forward passes (fewer when a VideoData source ends first); returns ``{output name: mean
    value}`` (Caffe averages each element), and for a DetectionEvaluate output its mAP over all the batches, as the
    SSD fork's solver computes it (the solver's scoring loop: solvers/evaluation.add_up)."""
    totals = add_up(net, batches(net, iterations), detection_outputs(net))
    means = {name: s / totals.done for name, s in totals.sums.items()}
    means.update({name: numpy.array(d.mean_ap(ap_version)) for name, d in totals.detections.items()})
    return means


def batches(net, iterations):
    """Run ``net``'s forward ``iterations`` times, yielding after each, then logging Caffe's ``Batch i, name = v``
    of its scalar outputs; stops early when a VideoData source ends (after at least one batch)."""
    for i in range(iterations):
        try:
            forward_settled(net)  # the scores repeat whether the engines were timed now or came from the cache
        except EndOfData as e:  # a video's last frame: the batches so far are the run
            if i == 0:
                raise
            log.info("%s: stopping after %d batches", e, i)
            return
        yield
        for name in net.outputs:
            value = net.blobs[name].data
            if value.size == 1:
                log.info("Batch %d, %s = %s", i, name, caffe_float(backend.to_numpy(value).reshape(-1)[0]))


def run(args):
    apply_decode_workers(args)
    setup_logging()
    xp = numpy if args.gpu is None else backend.gpu_array_module(args.gpu, "--gpu")
    net = Net(args.model, phase=args.phase, weights=args.weights, xp=xp, **net_state(args))
    ap_version = DEFAULT_AP_VERSION
    if detection_outputs(net):
        ap_version, why = ap_version_of(args)
        log.info("mAP of %s: %s AP (%s)", ", ".join(sorted(detection_outputs(net))), ap_version, why)
    means = score(net, args.iterations, ap_version)
    weights = output_weights(net)
    for name, value in means.items():
        if value.size != 1:
            continue
        v = float(value.reshape(-1)[0])
        w = weights.get(name, 0.0)
        suffix = f" (* {caffe_float(w)} = {caffe_float(w * v)} loss)" if w else ""
        log.info("%s = %s%s", name, caffe_float(v), suffix)
    return 0
