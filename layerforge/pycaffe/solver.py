"""pycaffe's solvers (``caffe.SGDSolver(path)``, ``caffe.get_solver(path)``): views of layerforge's Solver."""
from ..solvers import get_solver as _get_solver
from . import mode
from .net import Net


class Solver:
    """A solver built from a prototxt or YAML solver file; ``type`` forces the update rule (SGDSolver...).

    ``net`` and ``test_nets`` are pycaffe Net views of the solver's own nets; ``solver`` is the
    layerforge Solver.
    """

    type = None

    def __init__(self, solver_file, _solver=None):
        overrides = dict(mode.solver_overrides(), **({"type": self.type} if self.type else {}))
        self.solver = _solver or _get_solver(solver_file, **overrides)
        self.net = Net(None, _net=self.solver.net)
        self.test_nets = [Net(None, _net=n) for n in self.solver.test_nets]

    @property
    def iter(self):
        return self.solver.iter

    @property
    def param(self):
        return self.solver.param

    def step(self, iters):
        """Run ``iters`` training iterations (tests and snapshots as the solver file says)."""
        self.solver.step(iters)

    def solve(self, resume_file=None):
        """Train to ``max_iter`` (resuming from a solver state when given)."""
        self.solver.solve(resume_file=resume_file)

    def apply_update(self):
        """One update from the current parameter diffs (learning rate, normalisation, clipping, regularisation)."""
        self.solver.apply_update()

    def snapshot(self):
        return self.solver.snapshot()

    def restore(self, state_file):
        self.solver.restore(state_file)

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
