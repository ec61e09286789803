"""`layerforge train --devices 0,1`: a CGDP worker per GPU (the emulated devices where there is none) trains as one
CPU process with the whole batch (docs/cgdp.md), its chunks copied out of the devices and back."""
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


@pytest.mark.parametrize("flag", ["--devices", "--gpu"])  # --gpu 0,1: Caffe's -gpu form of the same
def test_train_on_two_devices_with_host_sync_is_one_process_with_the_whole_batch(files, flag):
    d, reference = files
    proc = layerforge("train", "--solver", "solver.yaml", flag, two_devices(), "--sync", "host",
                      "--chunk-size", 1, "--no-progress", cwd=d)
    report = (proc.stdout + proc.stderr).splitlines()
    assert any("Data parallel: 2 workers, sync host, chunk_size 1" in line for line in report)
    # a GPU worker's chunks are copied out of its diffs and back (a CPU worker's diffs are its slot: "-" there)
    header = next(i for i, line in enumerate(report) if line.split()[:2] == ["chunk", "copy-out"])
    rows = [line.split() for line in report[header + 1:header + 7]]
    assert [row[0] for row in rows] == ["ip5", "ip4", "ip3", "ip2", "ip1", "conv"]
    assert all(float(row[1]) > 0 and float(row[3]) > 0 for row in rows)
    with numpy.load(d / "out" / f"s_iter_{ITERS}.npz") as snapshot:
        for name, blobs in reference.net.params.items():
            for k, blob in enumerate(blobs):
                numpy.testing.assert_allclose(snapshot[f"{name}/{k}"], blob.data, rtol=1e-10, atol=1e-12,
                                              err_msg=name)
