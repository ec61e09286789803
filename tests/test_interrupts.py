"""Ctrl-C (SIGINT to the terminal's process group) and SIGTERM (``kill PID``) at each moment of a real
``layerforge`` process: the command ends within a few seconds, in one line and with the exit status a shell gives
a process the signal ended (130, 143), or, once training's loop runs, as a requested stop with a snapshot; and no
figure of a trial cut short is left in a cache (cpu_parallel.json, conv_engines.json)."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import weakref

import pytest
import yaml

from layerforge.npz import load_npz
from tests.test_cli import ROOT

FEW_SECONDS = 15.0  # from the signal to the exit, on a loaded 2-core machine


def write_net(tmp_path, size=48):
    """A net whose iterations take a while (a 16 -> 32 channel 3x3 convolution at ``size`` x ``size``, batch 8) on
    synthetic data, and its solver: long enough (max_iter 100000) for AUTO's CPU-parallelism trial, which splits its
    batch."""
    net = {"name": "slow", "layers": [
        {"name": "data", "type": "SyntheticData", "top": ["x", "label"],
         "synthetic_data": {"batch_size": 8, "shape": [16, size, size], "classes": 4, "grid": 2}},
        {"name": "conv", "type": "Convolution", "bottom": "x", "top": "conv",
         "convolution": {"num_output": 32, "kernel_size": 3, "weight_filler": {"type": "xavier"}}},
        {"name": "relu", "type": "ReLU", "bottom": "conv", "top": "conv"},
        {"name": "ip", "type": "InnerProduct", "bottom": "conv", "top": "ip",
         "inner_product": {"num_output": 4, "weight_filler": {"type": "xavier"}}},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"], "top": "loss"}]}
    (tmp_path / "net.yaml").write_text(yaml.safe_dump(net))
    solver = {"net": "net.yaml", "base_lr": 0.01, "momentum": 0.9, "max_iter": 100000, "display": 1,
              "snapshot": 0, "snapshot_prefix": str(tmp_path / "snap" / "slow"), "random_seed": 1}
    (tmp_path / "solver.yaml").write_text(yaml.safe_dump(solver))
    return tmp_path / "solver.yaml"


class Command:
    """``python -m layerforge ARGS`` of this checkout, run in ``tmp_path`` in a session of its own (a terminal's
    process group), its output read as it comes; the cache folder is the test's own."""

    def __init__(self, tmp_path, *args):
        self.cache = tmp_path / "cache"
        path = os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        # PYTHONFAULTHANDLER: a command still running after its signal is ended with SIGABRT (stuck()), on which
        # Python prints every thread's stack: the failure says where it waited
        env = dict(os.environ, LAYERFORGE_CACHE_DIR=str(self.cache), PYTHONUNBUFFERED="1", PYTHONPATH=path,
                   PYTHONFAULTHANDLER="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "layerforge", *map(str, args)], cwd=tmp_path, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.err, self.out = [], []
        self._readers = [threading.Thread(target=self._read, args=(stream, into), daemon=True)
                         for stream, into in ((self.proc.stderr, self.err), (self.proc.stdout, self.out))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, into):
        for line in stream:
            into.append(line)

    @property
    def log(self):
        return "".join(self.err)

    def wait_for(self, pattern, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.search(pattern, self.log):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        pytest.fail(f"no {pattern!r} (exit {self.proc.poll()}):\n{self.stuck()}")

    def stuck(self):
        """End the command, which did not end in time: its signal masks (SigBlk of its main thread: a signal
        blocked there waits for ever), then SIGABRT, on which it prints every thread's stack; the log's end."""
        masks = ""
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                masks = " ".join(line.strip() for line in f if line.startswith(("SigBlk", "SigIgn", "SigCgt")))
        except OSError:
            pass
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGABRT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for reader in self._readers:
            reader.join(10)
        return f"{masks}\n{self.log[-6000:]}"


    def signal(self, signum, group):
        """Send ``signum`` to the process group (a terminal's Ctrl-C) or to the process (``kill PID``); returns the
        exit status and the seconds until the exit."""
        sent = time.monotonic()
        if group:
            os.killpg(self.proc.pid, signum)
        else:
            self.proc.send_signal(signum)
        try:
            code = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 60 s after {signal.Signals(signum).name}:\n{self.stuck()}")
        took = time.monotonic() - sent
        for reader in self._readers:
            reader.join(10)
        return code, took

    def cached(self, name):
        """The cache file ``name``'s entries (``{key: value}`` over its machines), {} when there is none."""
        path = self.cache / name
        if not path.exists():
            return {}
        return {k: v for machine in json.loads(path.read_text()).values() for k, v in machine.items()}


def interrupted(command, code, took, signum):
    """The command ended at once, as the signal ends a command: its exit status, one line, no traceback."""
    assert code == 128 + signum, command.log[-3000:]
    assert took < FEW_SECONDS, (took, command.log[-3000:])
    assert command.err[-1].strip() == f"interrupted by {signal.Signals(signum).name}", command.log[-3000:]
    assert "Traceback" not in command.log and "KeyboardInterrupt" not in command.log, command.log[-3000:]


@pytest.mark.parametrize("mode, signum, group", [("THREADS", signal.SIGINT, True), ("THREADS", signal.SIGTERM, False),
                                                 ("REPLICAS", signal.SIGINT, True),
                                                 ("REPLICAS", signal.SIGTERM, False)])
def test_a_signal_during_the_cpu_parallelism_trial_ends_train_and_caches_no_figure(tmp_path, mode, signum, group):
    command = Command(tmp_path, "train", "--solver", write_net(tmp_path), "--no-progress")
    command.wait_for(r"timing THREADS: the first iteration took" if mode == "THREADS" else r"timing REPLICAS")
    time.sleep(0.3)  # well inside the timing
    code, took = command.signal(signum, group)
    interrupted(command, code, took, signum)
    assert command.cached("cpu_parallel.json") == {}
    assert "Solving" not in command.log  # no training after the trial


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_train_s_start_up_ends_it(tmp_path, signum):
    """A second after the start: Python runs, the command's modules are loading or the solver is being read (the
    trial, which follows, takes seconds more)."""
    command = Command(tmp_path, "train", "--solver", write_net(tmp_path), "--no-progress")
    time.sleep(1.0)
    code, took = command.signal(signum, group=signum == signal.SIGINT)
    interrupted(command, code, took, signum)
    cached = command.cached("cpu_parallel.json")
    # on an idle machine the trial of this small net can end within the second: then the cache holds the figure
    # the log printed, whole, and never one cut short
    assert cached == {} or all(f"(trial: {entry['trial']})" in command.log for entry in cached.values()), \
        (cached, command.log)


def test_ctrl_c_during_the_engine_choice_of_time_caches_no_timing(tmp_path):
    write_net(tmp_path)
    command = Command(tmp_path, "time", "--model", tmp_path / "net.yaml", "--iterations", 5,
                      "--cpu-parallel", "THREADS")
    command.wait_for(r"AUTO is timing the engines")
    code, took = command.signal(signal.SIGINT, group=True)
    interrupted(command, code, took, signal.SIGINT)
    assert command.cached("conv_engines.json") == {}  # the convolution was still timing: nothing chosen


def test_ctrl_c_while_train_settles_the_engines_ends_it_and_caches_no_timing(tmp_path):
    """The solver settles AUTO's choices before its first iteration (autotune.settle_apart): start-up still, so a
    Ctrl-C ends the command; the convolution was still timing, so nothing is cached."""
    command = Command(tmp_path, "train", "--solver", write_net(tmp_path, size=96), "--no-progress",
                      "--cpu-parallel", "THREADS")
    command.wait_for(r"AUTO is timing the engines")
    code, took = command.signal(signal.SIGINT, group=True)
    interrupted(command, code, took, signal.SIGINT)
    assert "Iteration 0 " not in command.log and "AUTO chose engines" not in command.log, command.log[-3000:]
    assert command.cached("conv_engines.json") == {}


def test_ctrl_c_during_the_first_iterations_of_train_stops_it_with_a_snapshot(tmp_path):
    command = Command(tmp_path, "train", "--solver", write_net(tmp_path), "--no-progress", "--cpu-parallel", "THREADS")
    command.wait_for(r"AUTO chose engines")  # settled before the first iteration, which follows
    code, took = command.signal(signal.SIGINT, group=True)
    assert code == 0 and took < FEW_SECONDS, (code, took, command.log[-3000:])
    assert command.log.count("Optimization stopped early.") == 1, command.log[-3000:]
    assert "Traceback" not in command.log, command.log[-3000:]
    snapshot, = (tmp_path / "snap").glob("slow_iter_*.solverstate.npz")
    state = load_npz(snapshot)["data_state"].item()
    assert '"timing": {"' not in state  # the snapshot keeps the choices: no round-robin to go on with
    choice, = command.cached("conv_engines.json").values()
    assert set(choice) == {"forward", "backward"} and all(f'"{d}": "{k}"' in state for d, k in choice.items())


def test_sigterm_during_test_ends_it(tmp_path):
    from layerforge.net.net import Net

    write_net(tmp_path)
    Net(str(tmp_path / "net.yaml"), phase="train").save(str(tmp_path / "w.npz"))
    command = Command(tmp_path, "test", "--model", tmp_path / "net.yaml", "--weights", tmp_path / "w.npz",
                      "--iterations", 100000)
    command.wait_for(r"Batch 1, loss = ")
    code, took = command.signal(signal.SIGTERM, group=False)
    interrupted(command, code, took, signal.SIGTERM)


def test_ctrl_c_while_plan_times_the_net_ends_it(tmp_path):
    command = Command(tmp_path, "plan", "--solver", write_net(tmp_path), "--nodes", 1024, "--iterations", 1000,
                      "--cost", "1e-5,1e-9,4e-9,1e-10")
    command.wait_for(r"plan: timing the train net")
    time.sleep(0.3)
    code, took = command.signal(signal.SIGINT, group=True)
    interrupted(command, code, took, signal.SIGINT)



# Python imports ``sitecustomize`` before the command's first line: this one makes one module's import take 5 s (a
# slow disk, a loaded machine), after it has marked the moment in a file, so that a test's signal comes right then
SLOW_IMPORT = """
import os, sys, time

class SlowImport:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ.get("LAYERFORGE_TEST_SLOW_IMPORT"):
            open(os.environ["LAYERFORGE_TEST_SLOW_MARK"], "w").close()
            time.sleep(5)
        return None

sys.meta_path.insert(0, SlowImport())
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("command, module, said", [
    ("train", "layerforge.cores", "interrupted during start-up"),  # the package's first imports
    ("time", "layerforge.cli", "interrupted during start-up"),  # the command line's module
    ("test", "layerforge.dataparallel.supervisor", "interrupted during start-up"),  # the last one before its handlers
    ("plan", "layerforge.commands.plan", "interrupted by")])  # the command's own imports: its handlers are in place
def test_a_signal_while_the_command_starts_ends_it_in_one_line(tmp_path, monkeypatch, command, module, said, signum):
    """From the first line of layerforge's code on, a signal ends the command in one line with 128 + the signal; it
    gave a KeyboardInterrupt traceback, or SIGTERM's silent death, until the command's handlers were in place."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_IMPORT)
    mark = tmp_path / "importing"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site)] + [p for p in os.environ.get("PYTHONPATH", "").split(
        os.pathsep) if p]))
    monkeypatch.setenv("LAYERFORGE_TEST_SLOW_IMPORT", module)
    monkeypatch.setenv("LAYERFORGE_TEST_SLOW_MARK", str(mark))
    solver = write_net(tmp_path)
    net = tmp_path / "net.yaml"
    args = {"train": ["--solver", solver], "time": ["--model", net], "test": ["--model", net, "--weights", net],
            "plan": ["--solver", solver, "--nodes", 1024]}
    run = Command(tmp_path, command, *args[command])
    deadline = time.monotonic() + 60
    while not mark.exists() and run.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert mark.exists(), run.log[-3000:]
    code, took = run.signal(signum, group=False)
    assert code == 128 + signum and took < FEW_SECONDS, (code, run.log[-3000:])
    assert run.err == [f"{said} {signal.Signals(signum).name}\n" if said == "interrupted by" else
                       f"{said} ({signal.Signals(signum).name})\n"], run.log[-3000:]


def test_a_program_that_imports_layerforge_keeps_its_signals():
    """The handlers Python starts with, whatever they are (a job started in the background by a shell without job
    control begins with SIGINT ignored, and Python then leaves it so), are the ones after ``import layerforge``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    show = "print(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, {})".format(
        "'ignored' if signal.getsignal(signal.SIGINT) == signal.SIG_IGN else "
        "signal.getsignal(signal.SIGINT) is signal.default_int_handler")
    shown = [subprocess.run([sys.executable, "-c", f"import signal{imports}; {show}"], env=env, capture_output=True,
                            text=True, check=True).stdout.split() for imports in ("", ", layerforge")]
    assert shown[1] == shown[0] and shown[0] in (["True", "True"], ["True", "ignored"]), shown


def test_after_the_command_s_handlers_python_s_own_are_back_not_the_start_up_ones():
    from layerforge.errors import _interrupted_during_start_up, interrupting

    before = {s: signal.signal(s, _interrupted_during_start_up) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with interrupting():
            pass
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_a_signal_python_could_not_raise_where_it_came_is_raised_again_unprinted(monkeypatch):
    """A signal during a weakref callback (the import machinery has some): Python prints what it raises there and
    goes on ("Exception ignored in ..."); interrupting() sends it again instead, raised a moment later."""
    from layerforge.errors import Interrupted, interrupting

    class Thing:
        pass

    def callback(ref):
        signal.raise_signal(signal.SIGTERM)  # its handler runs here, inside the callback

    printed = []
    monkeypatch.setattr(sys, "unraisablehook", printed.append)  # what Python would print
    with pytest.raises(Interrupted) as raised:
        with interrupting():
            thing = Thing()
            ref = weakref.ref(thing, callback)
            del thing
            sent = time.monotonic()
            while time.monotonic() < sent + 5:
                pass
    assert raised.value.signum == signal.SIGTERM and ref() is None
    assert time.monotonic() - sent < 1.0 and printed == []
    assert sys.unraisablehook == printed.append


# the layerforge command (a script of that name: errors._started_as_the_command), whose `layers` command starts a
# thread that never ends (as one waiting for a lock the signal left held where it came) and is then interrupted
STUCK_EXIT = """
import signal, sys, threading
from layerforge import cli, errors
from layerforge.commands import layers

errors.EXIT_WITHIN = 2.0

def run(args):
    threading.Thread(target=threading.Event().wait, name="stuck").start()  # not a daemon: the exit waits for it
    raise errors.Interrupted(signal.SIGINT)
layers.run = run
sys.exit(cli.main(["layers"]))
"""


def test_a_command_a_signal_ended_exits_though_a_thread_is_stuck(tmp_path):
    script = tmp_path / "layerforge"
    script.write_text(STUCK_EXIT)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    started = time.monotonic()
    child = subprocess.Popen([sys.executable, str(script)], env=env, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        out, err = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        pytest.fail(f"still running 60 s after its line: {child.communicate()}")
    assert child.returncode == 130 and err.strip() == "interrupted by SIGINT", (child.returncode, err[-3000:])
    assert 2.0 <= time.monotonic() - started < FEW_SECONDS
