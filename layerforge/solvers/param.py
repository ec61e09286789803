"""Solver definitions: YAML (or a dict) -> a validated SolverParameter, and the learning-rate policies.

Caffe's SolverParameter semantics; docs/solvers.md lists every key. Errors are one-line ConfigErrors
with file, line and key, as for net definitions (``solver.yaml:4: key 'lr_polcy': unknown key; did you
mean 'lr_policy'?``).
"""
import logging
import math
import os

from ..errors import ConfigError
from ..trace import parse_window
from ..schema import Context, LineDict, suggest, validate_block, with_lines, wrong_kind_of_file
from .caffe_solver import read_solver_file
from .keys import INLINE_KEYS, SOLVER_KEYS

class SolverParameter:
    """A validated solver: one attribute per key of ``SOLVER_KEYS`` plus ``path`` (the file, or None).

    ``net``/``train_net``/``test_net`` paths of a YAML solver are resolved against the solver file's directory;
    those of a Caffe prototxt solver (``caffe_paths``) against the working directory, as Caffe does (see resolve).
    ``lr_policy``, ``regularization_type``, ``solver_mode``, ``dtype``, ``gemm_precision``, ``allreduce``, ``sync``,
    ``sparse_update`` and ``sparse_aggregation`` are upper-case; ``type`` is the registered spelling (``"Adam"``).
    """

    def __init__(self, params, path, source, caffe_paths=False):
        self.__dict__.update(params.as_dict())
        self._params, self.path, self.source = params, path, source
        self.caffe_paths = caffe_paths
        self._said = set()  # the net paths found beside the solver, already said in a log line

    def given(self, key):
        return self._params.given(key)

    def line_of(self, key):
        return self.source.line_of(key) if isinstance(self.source, LineDict) else None

    def error(self, message, key=None):
        return ConfigError(message, self.path, self.line_of(key) if key else getattr(self.source, "line", None),
                           key=key)

    def resolve(self, path):
        """A net path from the file: relative to the solver file's directory in a YAML solver (the net is part of
        its definition); relative to the working directory in a Caffe prototxt solver, as Caffe reads it
        (``net: "examples/mnist/lenet_train_test.prototxt"``, run from the Caffe root). When a Caffe solver's
        net is not there but is beside the solver file, that one is used, and a log line says so."""
        if path is None or self.path is None or os.path.isabs(path):
            return path
        beside = os.path.join(os.path.dirname(os.path.abspath(self.path)), path)
        if not self.caffe_paths:
            return beside
        if os.path.exists(path) or not os.path.exists(beside):
            return path
        if path not in self._said:
            self._said.add(path)
            logging.getLogger("layerforge").warning(
                "%s: net '%s' is not in the working directory %s; using the one beside the solver file, %s",
                self.path, path, os.getcwd(), beside)
        return beside

    def inline_net(self, definition):
        """An inline net (a dict from this file) as a NetParameter whose errors name this file; else unchanged."""
        from ..net.netdef import load_net_def

        return load_net_def(definition, self.path) if isinstance(definition, dict) else definition

    def train_net_source(self):
        """The TRAIN net: ``net`` or ``train_net`` (paths resolved against this file), or the inline
        ``net_param`` / ``train_net_param`` (a NetParameter)."""
        return (self.resolve(self.net) or self.inline_net(self.net_param) or self.resolve(self.train_net)
                or self.inline_net(self.train_net_param))

    def as_dict(self):
        return self._params.as_dict()


def load_solver_param(source, registry, **overrides):
    """A path to a solver YAML file, or a dict (+ key overrides) -> SolverParameter; ConfigError on problems.

    A SolverParameter is not read again: it is returned as it is, or with ``overrides`` its keys (those of the
    file and the overrides it was given) are checked again with the new ones.
    """
    caffe_paths = False  # a Caffe prototxt solver's net paths are read from the working directory (resolve)
    if isinstance(source, SolverParameter):
        if all(value is None for value in overrides.values()):
            return source
        path, mapping, caffe_paths = source.path, source.source, source.caffe_paths
    elif isinstance(source, (str, os.PathLike)):
        path, mapping = str(source), read_solver_file(str(source))  # YAML, or a Caffe prototxt converted
        caffe_paths = getattr(mapping, "caffe_format", False)
    elif isinstance(source, dict):
        path, mapping = None, with_lines(source if isinstance(source, LineDict) else dict(source))
    else:
        raise TypeError(f"a solver is a YAML path or a dict, not {type(source).__name__}")
    if not isinstance(mapping, dict):
        raise ConfigError("a solver definition must be a mapping of keys", path, getattr(mapping, "line", 1))
    mistaken = wrong_kind_of_file(mapping, path, "solver")
    if mistaken is not None:
        raise mistaken
    merged = LineDict(mapping)
    merged.line, merged.key_lines = mapping.line, dict(mapping.key_lines or {})
    for key, value in overrides.items():
        if value is None:
            continue
        merged[key] = with_lines(value)
        merged.key_lines[key] = None  # an override has no line in the file
    for key in ("net_param", "train_net_param"):
        if key in merged and not isinstance(merged[key], dict):
            raise ConfigError("expected a mapping (a net definition)", path, merged.line_of(key), key=key)
    tnp = merged.get("test_net_param", [])
    if not isinstance(tnp, (dict, list)) or (isinstance(tnp, list) and not all(isinstance(t, dict) for t in tnp)):
        raise ConfigError("expected a net definition or a list of them", path, merged.line_of("test_net_param"),
                          key="test_net_param")
    if isinstance(merged.get("chunk_size"), int) and not isinstance(merged.get("chunk_size"), bool):
        merged["chunk_size"] = str(merged["chunk_size"])  # an int or "auto": kept as a string, checked in _check
    # inline nets are validated by the Net; the schema lists them only so unknown keys get suggestions
    plain = LineDict((k, v) for k, v in merged.items() if k not in INLINE_KEYS)
    plain.line, plain.key_lines = merged.line, merged.key_lines
    checked = validate_block(plain, SOLVER_KEYS, Context(path))
    checked.__dict__.update(net_param=merged.get("net_param"), train_net_param=merged.get("train_net_param"),
                            test_net_param=[tnp] if isinstance(tnp, dict) else list(tnp))
    checked._given = frozenset(merged)
    sp = SolverParameter(checked, path, merged, caffe_paths)
    _check(sp, registry)
    return sp


def _check(sp, registry):
    try:
        parse_window(sp.trace_iterations)
    except ValueError as e:
        raise sp.error(str(e), "trace_iterations") from None
    names = {n.upper(): n for n in registry}
    if sp.type.upper() not in names:
        near = suggest(sp.type.upper(), list(names))
        near = f"; did you mean '{names[near.split(chr(39))[1]]}'?" if near else ""
        raise sp.error(f"unknown solver type '{sp.type}'; expected one of {', '.join(registry)}{near}", "type")
    sp.type = names[sp.type.upper()]
    train = [k for k in ("net", "net_param", "train_net", "train_net_param") if getattr(sp, k) is not None]
    if len(train) != 1:
        raise sp.error("give exactly one of net, net_param, train_net, train_net_param"
                       + (f" (got {', '.join(train)})" if train else ""), train[1] if len(train) > 1 else None)
    n_specific = len(sp.test_net) + len(sp.test_net_param)
    generic = train[0] in ("net", "net_param")
    n_test = max(n_specific, len(sp.test_iter)) if generic else n_specific
    if len(sp.test_iter) != n_test:
        raise sp.error(f"test_iter has {len(sp.test_iter)} entries for {n_test} test net(s); give one per test net",
                       "test_iter")
    if sp.test_state and len(sp.test_state) != n_test:
        raise sp.error(f"test_state has {len(sp.test_state)} entries for {n_test} test net(s)", "test_state")
    sp.num_test_nets = n_test
    size = str(sp.chunk_size).strip().lower()
    if size != "auto" and not (size.isdigit() and int(size) >= 1):
        raise sp.error(f"expected a positive integer or auto, got {sp.chunk_size!r}", "chunk_size")
    sp.chunk_size = size if size == "auto" else int(size)
    policy = sp.lr_policy
    need = {"STEP": ("gamma", "stepsize"), "EXP": ("gamma",), "INV": ("gamma", "power"), "MULTISTEP": ("gamma",),
            "POLY": ("power",), "SIGMOID": ("gamma", "stepsize")}.get(policy, ())
    for key in need:
        if getattr(sp, key) is None:
            raise sp.error(f"lr_policy {policy.lower()} needs '{key}'", key if sp.given(key) else "lr_policy")
    if policy == "MULTISTEP":
        if not sp.stepvalue:
            raise sp.error("lr_policy multistep needs 'stepvalue' (a list of iterations)", "lr_policy")
        if any(b <= a for a, b in zip(sp.stepvalue, sp.stepvalue[1:])):
            raise sp.error(f"must be strictly increasing, got {sp.stepvalue}", "stepvalue")
    if policy == "POLY" and sp.max_iter <= 0:
        raise sp.error("lr_policy poly needs max_iter > 0 (lr reaches 0 at max_iter)", "max_iter")
    validate = getattr(registry[sp.type], "validate_params", None)
    if validate is not None:
        validate(sp)


def policy_rate(sp, it):
    """Caffe's SGDSolver::GetLearningRate at iteration ``it`` (before warm-up)."""
    p, base = sp.lr_policy, sp.base_lr
    if p == "FIXED":
        return base
    if p == "STEP":
        return base * sp.gamma ** (it // sp.stepsize)
    if p == "EXP":
        return base * sp.gamma ** it
    if p == "INV":
        return base * (1.0 + sp.gamma * it) ** (-sp.power)
    if p == "MULTISTEP":
        return base * sp.gamma ** sum(1 for v in sp.stepvalue if it >= v)
    if p == "POLY":
        return base * max(0.0, 1.0 - it / sp.max_iter) ** sp.power  # 0 past max_iter (a resumed longer run)
    if p == "SIGMOID":
        return base * (1.0 / (1.0 + math.exp(-sp.gamma * (it - sp.stepsize))))
    raise AssertionError(p)


def learning_rate(sp, it):
    """The rate of iteration ``it``: the policy's rate, times a linear warm-up factor while ``it < warmup_iter``.

    warm-up factor = f + (1 - f) * it / warmup_iter with f = ``warmup_start_lr_factor`` (Goyal et al. 2017).
    """
    rate = policy_rate(sp, it)
    if it < sp.warmup_iter:
        f = sp.warmup_start_lr_factor
        rate *= f + (1.0 - f) * it / sp.warmup_iter
    return rate
