"""pycaffe's solvers (``caffe.SGDSolver(path)``, ``caffe.get_solver(path)``): views of layerforge's Solver."""
from ..solvers import get_solver as _get_solver
from ..solvers.param import learning_rate
from ..solvers.seam import Seam
from . import mode
from .blob import after_sync, synced
from .net import Net


class SolverParameter:
    """pycaffe's ``solver.param``: the solver's own layerforge SolverParameter (every key, live: setting ``base_lr``
    changes the next update's rate), with Caffe's name ``layer_wise_reduce`` for ``allreduce_overlap``."""

    def __init__(self, sp):
        object.__setattr__(self, "_sp", sp)

    @property
    def layer_wise_reduce(self):
        return self._sp.allreduce_overlap

    def __getattr__(self, name):
        return getattr(self._sp, name)

    def __setattr__(self, name, value):
        setattr(self._sp, "allreduce_overlap" if name == "layer_wise_reduce" else name, value)

    def __repr__(self):
        return f"<caffe.SolverParameter of {self._sp.path or 'a mapping'}>"


class _LaterRank(Seam):
    """Rank r > 0 of ``caffe.solver_count()`` solvers: it trains silently (rank 0 displays, tests and snapshots)."""

    root = False


class _Callback(Seam):
    """Caffe's Solver::Callback at the solver's seam: ``on_start()`` at the start of every iteration (after its test,
    before the first forward pass) and ``on_gradients_ready()`` once the diffs hold the gradients summed over the
    iter_size passes (after the display), before the update."""

    def __init__(self, on_start, on_gradients_ready):
        self.on_start, self.on_gradients_ready = on_start, on_gradients_ready

    def before_pass(self, k):
        if k == 0:
            self.on_start()

    def before_update(self):
        self.on_gradients_ready()
        return True


class Solver:
    """A solver built from a prototxt or YAML solver file; ``type`` forces the update rule (SGDSolver...).

    ``net`` and ``test_nets`` are pycaffe Net views of the solver's own nets; ``solver`` is the
    layerforge Solver. As in pycaffe, the device is the one of ``caffe.set_mode_cpu()`` / ``set_mode_gpu()``
    (the file's ``solver_mode`` is for the command line), and after ``caffe.set_solver_count(n)`` /
    ``set_solver_rank(r)`` the solver is rank r of n: its data layers read its share of the records, and only rank 0
    displays, tests and snapshots.
    """

    type = None

    def __init__(self, solver_file, _solver=None):
        overrides = dict(mode.solver_overrides(), **({"type": self.type} if self.type else {}))
        self.solver = _solver or _get_solver(solver_file, shard=mode.solver_shard(), **overrides)
        if _solver is None and mode.solver_rank() > 0:
            self.solver.add_seam(_LaterRank())
        self.net = Net(None, _net=self.solver.net)
        self.test_nets = [Net(None, _net=n) for n in self.solver.test_nets]

    @property
    def iter(self):
        return self.solver.iter

    @property
    def param(self):
        return SolverParameter(self.solver.param)

    @property
    def lr(self):
        """The learning rate of the current iteration (Caffe's SGDSolver::GetLearningRate)."""
        return learning_rate(self.solver.param, self.solver.iter)

    @synced
    def step(self, iters):
        """Run ``iters`` training iterations (tests and snapshots as the solver file says)."""
        self.solver.step(iters)

    @synced
    def solve(self, resume_file=None):
        """Train to ``max_iter`` (resuming from a solver state when given)."""
        self.solver.solve(resume_file=resume_file)

    @synced
    def apply_update(self):
        """One update from the current parameter diffs (learning rate, normalisation, clipping, regularisation)."""
        self.solver.apply_update()

    @synced
    def snapshot(self):
        return self.solver.snapshot()

    @synced
    def restore(self, state_file):
        self.solver.restore(state_file)

    def share_weights(self, net):
        """Make ``net`` use this solver's train-net parameters (same storage), layer by name."""
        net.share_with(self.net)

    def add_callback(self, on_start, on_gradients_ready=None):
        """Caffe's Solver::Callback: ``on_start()`` at the start of every iteration (after its test, before the
        forward passes) and ``on_gradients_ready()`` once the gradients are summed, before the update. One object
        with both methods (a caffe.NCCL) may be given instead. Callbacks act in the order they were added."""
        if on_gradients_ready is None:
            on_start, on_gradients_ready = on_start.on_start, on_start.on_gradients_ready
        self.solver.add_seam(_Callback(after_sync(on_start), after_sync(on_gradients_ready)))

    def __repr__(self):
        return f"<caffe.{type(self).__name__} view of {self.solver!r}>"


def _solver_class(name):
    return type(f"{name}Solver", (Solver,), {"type": name, "__doc__": f"A {name} solver (Caffe's {name}Solver)."})


SGDSolver = _solver_class("SGD")
NesterovSolver = _solver_class("Nesterov")
AdaGradSolver = _solver_class("AdaGrad")
RMSPropSolver = _solver_class("RMSProp")
AdaDeltaSolver = _solver_class("AdaDelta")
AdamSolver = _solver_class("Adam")


def get_solver(solver_file):
    """The solver of the type its file names (SGD when it names none)."""
    return Solver(solver_file)
