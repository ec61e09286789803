"""Caffe SolverParameter messages -> layerforge solver mappings; solver files read in either format, and any
config file (a net or a solver) told apart and converted. layerforge/caffe/message_reader.py says how a message
maps onto the schemas.
"""
import os

from ..caffe.message_reader import IGNORED, line_dict, line_list, put
from ..caffe.prototxt import Message, read_yaml_or_prototxt
from ..errors import ConfigError
from ..net.caffe_net import NET_FIELDS, NetConverter, as_list
from .keys import SOLVER_KEYS, STATE

# SolverParameter.solver_type (deprecated enum) -> solver type name
SOLVER_TYPES = {"SGD": "SGD", "NESTEROV": "Nesterov", "ADAGRAD": "AdaGrad", "RMSPROP": "RMSProp",
                "ADADELTA": "AdaDelta", "ADAM": "Adam"}


def default_net_name(path):
    """``examples/mnist/lenet_train_test.prototxt`` -> ``lenet_train_test.yaml``."""
    base = os.path.basename(str(path))
    return (base[:-len(".prototxt")] if base.endswith(".prototxt") else os.path.splitext(base)[0]) + ".yaml"


class CaffeConverter(NetConverter):
    """Converts one parsed file: a net, or a solver with its inline nets."""

    def solver(self, msg, rename_net=None):
        """SolverParameter -> layerforge solver mapping (validated by load_solver_param, which reads it).

        ``rename_net(old_path, key)`` gives the new value of each ``net`` / ``train_net`` / ``test_net`` path
        (default: the base name with ``.yaml``).
        """
        rename_net = rename_net or (lambda old, key: default_net_name(old))
        out = line_dict(msg.line)
        where = (None, None)
        for name in msg.names():
            entries = msg.all(name)
            line = entries[0].line
            if name in IGNORED["solver"]:
                continue
            if name in ("net_param", "train_net_param", "test_net_param"):
                nets = [self.net(e.value) for e in entries if self.is_message(e, name)]
                if name != "test_net_param":
                    self.singular(entries, where, name)
                put(out, name, nets[0] if len(nets) == 1 else line_list(nets, line), line)
            elif name in ("train_state", "test_state"):
                phase = "TRAIN" if name == "train_state" else "TEST"
                states = [self.net_state(e, phase) for e in entries if self.is_message(e, name)]
                if name == "train_state":
                    self.singular(entries, where, name)
                put(out, name, states[0] if name == "train_state" else line_list(states, line), line)
            elif name == "solver_type":
                self.singular(entries, where, name)
                value = str(entries[0].value).upper()
                if value not in SOLVER_TYPES:
                    raise self.error(f"unknown solver_type {entries[0].value}", line, key=name)
                if "type" in msg:
                    raise self.error("give 'type' or the deprecated 'solver_type', not both", line, key=name)
                put(out, "type", SOLVER_TYPES[value], line)
            elif name in ("net", "train_net", "test_net"):
                value = self.value(entries, SOLVER_KEYS[name], name, where, name)
                renamed = [self.rename(v, name, rename_net) for v in as_list(value, line)]
                put(out, name, renamed[0] if name != "test_net" else line_list(renamed, line), line)
            elif name == "layer_wise_reduce":  # Caffe's "overlap compute and communication" is allreduce_overlap
                put(out, "allreduce_overlap", self.value(entries, SOLVER_KEYS["allreduce_overlap"], name, where, name),
                    line)
            elif name in SOLVER_KEYS:
                put(out, name, self.value(entries, SOLVER_KEYS[name], name, where, name), line)
            else:
                raise self.no_equivalent(name, "SolverParameter", line, key=name)
        if "base_lr" not in out:
            put(out, "base_lr", 0.0, None)  # Caffe's default; layerforge's own default is 0.01
            self.notes.append("base_lr is not given: Caffe's default 0 is written out")
        if "snapshot_format" not in out:  # Caffe's default: .caffemodel + .solverstate, as Caffe's tools expect
            put(out, "snapshot_format", "BINARYPROTO", None)
        return out

    def net_state(self, entry, phase):
        state = entry.value
        for e in state.all("phase"):
            if str(e.value) != phase:
                raise self.error(f"a {phase.lower()} net's phase is {phase}, got {e.value}", e.line, key="phase")
        kept = Message(state.line, state.path)
        kept.entries = [e for e in state.entries if e.name != "phase"]
        return self.block(kept, STATE, "state", (None, None), "state.")

    def rename(self, old, key, rename_net):
        new = rename_net(old, key)
        if new != old:
            self.notes.append(f"{key}: '{old}' -> '{new}' (layerforge reads it relative to the solver YAML; "
                              "convert the Caffe net to that file)")
        return new


def kind_of(msg):
    """``"net"`` or ``"solver"``: which message a parsed file holds."""
    names = set(msg.names())
    if names & set(NET_FIELDS):
        return "net"
    if names & (set(SOLVER_KEYS) | {"solver_type"} | IGNORED["solver"]):
        return "solver"
    raise ConfigError("cannot tell whether this is a net (no 'layer' entries) or a solver (no solver fields)",
                      msg.path, msg.line)


def message_to_mapping(msg, path=None, rename_net=None):
    """A parsed file -> ``(kind, mapping, notes)``, the mapping not yet read by its loader (layerforge/solvers/
    caffe_import.py checks it too)."""
    conv = CaffeConverter(path)
    kind = kind_of(msg)
    mapping = conv.net(msg) if kind == "net" else conv.solver(msg, rename_net)
    return kind, mapping, conv.notes


def _keep_net_paths(old, key):
    return old  # a solver's net files are read where they are, as they are (prototxt too): no renaming to .yaml


def read_solver_file(path):
    """A solver file (YAML, or a Caffe prototxt solver converted) -> its mapping, not yet validated; a converted
    mapping has ``caffe_format = True`` (its net paths are read as Caffe reads them, SolverParameter.resolve)."""
    def convert(msg, where):
        mapping = message_to_mapping(msg, where, _keep_net_paths)[1]
        mapping.caffe_format = True
        return mapping

    return read_yaml_or_prototxt(path, convert)


def read_config_file(path):
    """Any config file, a net or a solver (YAML, or Caffe prototxt converted) -> its mapping, not yet validated."""
    return read_solver_file(path)
