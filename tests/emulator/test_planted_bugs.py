"""Bugs planted in layerforge's own Python code are caught by the project's GPU tests on the emulated device.

Each test plants one bug (the source of one function with one line changed, put in place for the test) and runs a
project test that must then fail, while the same test passes on the CPU with the bug in place: a bug only a device
run shows. The kernel bugs are planted in the .cu text by test_kernel_runner_checks.py (a removed
``__syncthreads``, an argument of the wrong C type) and test_kernel_runner_sanitizers.py (the race and the
out-of-bounds read the sanitizers report).
"""
import inspect
import re
import textwrap

import numpy
import pytest

from layerforge.layers.multibox_loss import MultiBoxLoss
from layerforge.layers.pooling import Pooling
from tests.layers import test_every_layer_on_xp as every_layer
from tests.solvers import test_cuda_graph as cuda_graph


def plant(monkeypatch, owner, name, pattern, new):
    """For the test, ``owner.name`` (a function or method) is its own source with the one match of ``pattern`` (a
    regular expression: the site is found by what the code does, wherever it sits) replaced by ``new``; fails
    loudly when the site is gone or ambiguous."""
    function = getattr(owner, name)
    source = textwrap.dedent(inspect.getsource(function))
    planted, n = re.subn(pattern, new, source)
    assert n == 1, f"{pattern!r} matches {n} times in {owner.__name__}.{name}, not once: the planted site moved"
    made = {}
    exec(compile(planted, inspect.getsourcefile(function), "exec"), function.__globals__, made)
    monkeypatch.setattr(owner, name, made[name])


def test_a_numpy_array_in_a_cupy_operation(monkeypatch):
    import cupy

    # planted: MultiBoxLoss subtracts its host-side targets without copying them to the device first
    plant(monkeypatch, MultiBoxLoss, "location_loss", r"-\s*xp\.asarray\(\s*target\s*,\s*self\.dtype\s*\)\)", "- target)")
    every_layer.test_layer_agrees_with_numpy("MultiBoxLoss", numpy)  # numpy does not mind
    with pytest.raises(TypeError, match="Unsupported type <class 'numpy.ndarray'>"):
        every_layer.test_layer_agrees_with_numpy("MultiBoxLoss", cupy)


def test_a_host_synchronisation_inside_graph_capture(monkeypatch):
    # planted: Pooling reads a device value on the host in the middle of the recorded body (the training goes on
    # without graphs, with the same results, so the device test's check that recording succeeded is what fails)
    plant(monkeypatch, Pooling, "forward", r"x = bottom\[0\]\.data\n", "x = bottom[0].data; float(x.max())\n")
    with pytest.raises(AssertionError) as failure:
        cuda_graph.test_training_with_graphs_on_the_device_equals_training_without("resnet block", 12)
    assert ("layer 'pool' (Pooling): RuntimeError: the current stream is capturing, so D2H transfers are "
            "disallowed") in str(failure.value)
