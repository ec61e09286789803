"""Every wait_event / synchronize of layerforge's stream code matters: removing any one of them makes a GPU test fail.

The sites are found by what they are (a statement that calls ``.wait_event(`` or ``.synchronize(``, located
with the ast module: layerforge_emulator/planted.py), never by line number. For each one, the test runs the GPU
tests of its table in a subprocess with ``LAYERFORGE_EMULATED_GPU_REMOVE`` naming the site (the module is compiled
with that statement replaced by ``pass``, in the workers that subprocess starts too) and asserts that they fail.
The table and the sites found must agree: a site that moved to another function or changed its text, or a new one,
fails :func:`test_the_table_names_every_site`, and a module of layerforge with such a statement must be in the table
or among the modules whose waits only time work (:data:`TIMING`).

The scenarios below are GPU tests of their own: the stream code used as training uses it, with no host read
between iterations (a host read waits for everything, which hides a missing wait).
"""
import os
import pathlib
import subprocess
import sys

import numpy
import pytest

from layerforge_emulator import planted
from tests.emulator.emulated import cupy  # noqa: F401 - the fixture

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = "tests/emulator/test_stream_sites.py::"
FEED = "tests/data/test_device_feed.py::"
WORKER = "tests/trace/test_cgdp.py::test_a_gpu_worker_records_copy_out_and_copy_back_between_backward_and_its_wait"
GRAPHS = ("tests/solvers/test_cuda_graph.py::"
          "test_training_with_graphs_on_the_device_equals_training_without[resnet block-12]")
MOVER = "tests/dataparallel/cgdp/test_transfer.py::"
COPY_OUT = MOVER + "test_a_chunk_copied_out_holds_the_gradients_backward_wrote_before_its_mark[cupy-shapes0]"
NCCL = "tests/comm/test_local.py::test_nccl_allreduce_on_the_device_returns_once_every_rank_has_given_its_part"
SCENARIOS = [HERE + "test_a_device_feed_read_without_host_reads_between_batches",
             HERE + "test_a_device_feed_closed_while_a_copy_is_pending"]

# module -> {(function, the call as written): the GPU tests of which at least one fails without it, every time
# (each leaves the work the site orders queued where nothing else runs it, so no seed or thread timing hides it)}
SITES = {
    "layerforge.data.device_feed": {
        ("DeviceFeed.next_into", "stream.wait_event(slot.copied)"): [FEED + "test_batches_arrive_in_order_and_are_read_one_ahead_on_a_device[cupy]"],
        ("DeviceFeed._stage", "slot.copied.synchronize()"): SCENARIOS,
        ("DeviceFeed._stage", "self.copy_stream.wait_event(self.xp.cuda.get_current_stream().record())"): SCENARIOS,
        ("DeviceFeed._stage", "self.copy_stream.wait_event(slot.consumed)"): SCENARIOS,
        ("DeviceFeed.close", "self.copy_stream.synchronize()"): SCENARIOS,
    },
    "layerforge.dataparallel.cgdp.transfer": {
        ("CupyMover.to_host", "self.stream.wait_event(token)"): [COPY_OUT],
        ("CupyMover.to_host", "self.stream.synchronize()"): [COPY_OUT],
        ("CupyMover.synchronize", "self.stream.synchronize()"): [WORKER],
        ("CupyMover.close", "self.stream.synchronize()"):
            [MOVER + "test_a_mover_closed_with_copies_back_queued_leaves_the_gradients_whole[cupy-shapes0]"],
    },
    "layerforge.dataparallel.cgdp.host": {
        ("HostSync.before_update", "self.mover.synchronize()"): [WORKER],
    },
    "layerforge.solvers.solver": {
        ("Solver.step", "self._stream.wait_event(self.xp.cuda.Stream.null.record())"): [GRAPHS],
        ("Solver.step", "self._stream.synchronize()"): [GRAPHS],
    },
    "layerforge.comm.nccl": {  # the NCCL allreduce returns with the collective done, as the table's others
        ("allreduce_nccl", "stream.synchronize()"): [NCCL + "[True]"],
    },
}


# modules whose waits only time work (their removal changes a measurement, not a result)
TIMING = {
    "layerforge.backend": "Stopwatch.stop waits for its end event to read the device time",
    "layerforge.trace.nvtx": "DeviceTimer waits for its events to read device spans",
    "layerforge.dataparallel.cgdp.cost_model": "measure_rates waits so that its clock times the copies",
}


def test_every_module_with_stream_waits_is_in_the_table_or_only_times():
    package = ROOT / "layerforge"
    having = {".".join(p.relative_to(ROOT).with_suffix("").parts) for p in package.rglob("*.py")
              if planted.stream_calls(p.read_text())}
    assert having == set(SITES) | set(TIMING)


def found_sites():
    return {module: {site[:2] for site in planted.stream_calls(_source(module))} for module in SITES}


def _source(module):
    return (ROOT / (module.replace(".", "/") + ".py")).read_text()


def test_the_table_names_every_site():
    assert found_sites() == {module: set(sites) for module, sites in SITES.items()}


def _run(tests, remove=None):
    env = dict(os.environ, LAYERFORGE_EMULATED_GPU="1", PYTHONPATH=str(ROOT))
    env.pop(planted.REMOVE_ENV, None)
    if remove:
        env[planted.REMOVE_ENV] = remove
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("module,function,call", [(m, f, c) for m, sites in SITES.items() for f, c in sites])
def test_removing_the_site_fails_a_gpu_test(module, function, call):
    tests = SITES[module][function, call]
    assert (function, call) in found_sites()[module], f"{call} is no longer in {module}.{function}"
    proc = _run(tests, f"{module}|{function}|{call}")
    assert proc.returncode == 1 and " failed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_the_tables_tests_pass_with_every_site_in_place():
    tests = sorted({t for sites in SITES.values() for ts in sites.values() for t in ts})
    proc = _run(tests)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _batches(n):
    for i in range(n):
        yield (numpy.full((4, 3), i, numpy.float32),), None


def test_a_device_feed_read_without_host_reads_between_batches(cupy):
    from layerforge.data.device_feed import DeviceFeed

    outs = [cupy.zeros((4, 3), numpy.float32) for _ in range(5)]
    used = [cupy.ones((4, 3), numpy.float32) for _ in range(2)]
    del used  # the feed's device buffers will be these blocks, from the compute stream's pool
    feed = DeviceFeed(cupy, _batches(6))
    for out in outs:
        feed.next_into([out])
        out *= 2  # the compute stream works on each batch as a layer would
    feed.close()
    assert [float(out[0, 0]) for out in outs] == [0, 2, 4, 6, 8]


def test_a_device_feed_closed_while_a_copy_is_pending(cupy):
    import gc

    from layerforge.data.device_feed import DeviceFeed

    feed = DeviceFeed(cupy, _batches(3))
    out = cupy.zeros((4, 3), numpy.float32)
    feed.next_into([out])  # and the next batch's copy is queued
    feed.close()
    del feed
    gc.collect()
    reused = [cupy.full((4, 3), -1, numpy.float32) for _ in range(4)]  # the pool hands the slots' blocks out again
    cupy.cuda.Device().synchronize()
    assert float(out[0, 0]) == 0 and all((r.get() == -1).all() for r in reused)
