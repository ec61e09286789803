"""Solvers: the training loop and one update rule per class (Caffe's solvers/).

    solver = layerforge.get_solver("configs/lenet_solver.yaml", max_iter=100)
    solver.solve()                       # or solver.step(10); solver.test_all()
    solver.net, solver.test_nets, solver.iter, solver.restore("lenet_iter_100.solverstate.npz")

docs/solvers.md describes the solver YAML, the update formulas, the lr policies and snapshots.
"""
from .keys import LR_POLICIES, SOLVER_KEYS
from .param import SolverParameter, learning_rate, load_solver_param, policy_rate
from .seam import Seam
from .solver import SOLVER_REGISTRY, NonFiniteError, Solver, get_solver, register_solver

# Importing a module registers its rules.
from .sgd import NesterovSolver, SGDSolver  # noqa: E402
from .adagrad import AdaGradSolver  # noqa: E402
from .rmsprop import RMSPropSolver  # noqa: E402
from .adadelta import AdaDeltaSolver  # noqa: E402
from .adam import AdamSolver  # noqa: E402

__all__ = ["Solver", "Seam", "get_solver", "register_solver", "SOLVER_REGISTRY", "NonFiniteError", "SolverParameter",
           "load_solver_param", "learning_rate", "policy_rate", "SOLVER_KEYS", "LR_POLICIES",
           "SGDSolver", "NesterovSolver", "AdaGradSolver", "RMSPropSolver", "AdaDeltaSolver", "AdamSolver"]
