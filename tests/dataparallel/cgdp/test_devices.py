"""`layerforge train --devices 0,1`: a CGDP worker per GPU (the emulated devices where there is none) trains as one
CPU process with the whole batch (docs/cgdp.md); `layerforge time --devices` times the workers' device copies."""
import json
import os
import subprocess
import sys

import numpy
import pytest
import yaml

from layerforge.solvers import get_solver
from tests.devices import two_devices
from tests.test_cli import ROOT

from .helpers import net, solver, write_lmdb

ITERS = 4


def layerforge(*args, cwd):
    proc = subprocess.run([sys.executable, "-m", "layerforge", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The LMDB, a net of batch 4 per worker and its solver (snapshots under out/), and the whole batch's
    reference: one CPU solver of batch 8, trained."""
    d = tmp_path_factory.mktemp("devices")
    source = write_lmdb(d / "db")
    (d / "net.yaml").write_text(yaml.safe_dump(net(source, 4)))
    keys = {k: v for k, v in solver(source, 4, ITERS).items() if k != "net_param"}
    (d / "solver.yaml").write_text(yaml.safe_dump(dict(keys, net="net.yaml", snapshot_prefix="out/s",
                                                       snapshot_after_train=True, display=1)))
    reference = get_solver(solver(source, 8, ITERS))
    reference.solve()
    return d, reference


def test_train_on_two_devices_with_host_sync_is_one_process_with_the_whole_batch(files):
    d, reference = files
    proc = layerforge("train", "--solver", "solver.yaml", "--devices", two_devices(), "--sync", "host", "--chunk-size", 1,
                      "--no-progress", cwd=d)
    assert "Data parallel: 2 workers, sync host, chunk_size 1" in proc.stdout + proc.stderr
    with numpy.load(d / "out" / f"s_iter_{ITERS}.npz") as snapshot:
        for name, blobs in reference.net.params.items():
            for k, blob in enumerate(blobs):
                numpy.testing.assert_allclose(snapshot[f"{name}/{k}"], blob.data, rtol=1e-10, atol=1e-12,
                                              err_msg=name)


def test_time_on_two_devices_times_the_copies_to_and_from_the_device(files):
    d, _ = files
    timing = json.loads(layerforge("time", "--model", "net.yaml", "--devices", two_devices(), "--iterations", 2, "--json",
                                   cwd=d).stdout)
    assert timing["G"] == 2 and timing["sync"] == "HOST"
    # a GPU worker's chunks are copied out of its diffs and back (CPU workers' diffs are their slots: 0 there)
    assert timing["rates"]["copy_out"] > 0 and timing["rates"]["copy_back"] > 0
    assert all(timing["phases_ms"][p] > 0 for p in ("forward", "backward", "update", "iteration"))
