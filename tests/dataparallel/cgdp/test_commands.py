"""`layerforge time --workers` and `layerforge plan --workers`: the CGDP report and the cost-model plan."""
import json
import subprocess
import sys

import pytest

from layerforge.dataparallel.cgdp.cost_model import predict_rows
from layerforge.dataparallel.cgdp.cost_model import Rates, from_stats
from tests.dataparallel.cgdp.helpers import SMALL_NET as NET
from tests.test_cli import ROOT


def layerforge(*args, cwd):
    return subprocess.run([sys.executable, "-m", "layerforge", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300, env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"})


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan")
    (d / "net.yaml").write_text(NET)
    (d / "solver.yaml").write_text("net: net.yaml\nbase_lr: 0.01\nmax_iter: 100\n")
    return d


@pytest.fixture(scope="module")
def timing(files):
    proc = layerforge("time", "--model", "net.yaml", "--workers", 2, "--iterations", 2, "--json", cwd=files)
    assert proc.returncode == 0, proc.stderr
    (files / "timing.json").write_text(proc.stdout)
    return json.loads(proc.stdout)


def test_time_workers_reports_phases_chunks_and_rates(timing):
    assert timing["G"] == 2 and timing["sync"] == "HOST" and timing["iterations"] == 2
    assert [name for _, name, _ in timing["units"]] == ["ip2", "ip1", "conv1"]
    assert [n for _, _, n in timing["units"]] == [32 * 5 + 5, 8 * 10 * 10 * 32 + 32, 8 * 3 * 3 * 3 + 8]
    assert all(timing["phases_ms"][p] > 0 for p in ("forward", "backward", "update", "iteration"))
    rates = timing["rates"]
    assert set(rates) == set(Rates._fields)
    assert rates["copy_out"] == rates["copy_back"] == 0.0  # CPU workers' diffs live in their shared slots
    assert all(rates[k] > 0 for k in ("host_combine", "root_add", "root_scale", "param_out", "param_in"))
    assert set(timing["chunks_ms"]) == {f"accumulate:{n}" for n in ("ip2", "ip1", "conv1")}


def test_plan_from_a_timing_matches_the_model(files, timing):
    proc = layerforge("plan", "--solver", "solver.yaml", "--workers", "2,4,8", "--timing", "timing.json", "--json",
                      cwd=files)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    model = from_stats(timing)
    assert [r["G"] for r in out["rows"]] == [2, 4, 8]
    for r in out["rows"]:
        G = r["G"]
        assert r["host_ms"] == pytest.approx(1000 * model.host(G))
        assert r["tree_ms"] == pytest.approx(1000 * model.tree(G))
        assert r["speedup_host"] == pytest.approx(G * (model.F + model.B + model.U) / model.host(G))
        assert r["winner"] == ("host" if r["host_ms"] <= r["tree_ms"] else "tree")
        assert r["best_host_ms"] <= r["host_ms"] + 1e-9
    assert out["rows"] == predict_rows(timing, (2, 4, 8))


def test_plan_times_the_net_itself_and_prints_a_table(files):
    proc = layerforge("plan", "--solver", "solver.yaml", "--workers", "4", "--iterations", 1, cwd=files)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("measured with 2 workers, host mode")
    assert lines[1].startswith("rates (ns per value): copy out ")
    assert lines[2].split()[:3] == ["G", "host", "T"]
    assert lines[3].split()[0] == "4" and len(lines) == 4


@pytest.mark.parametrize("args,message", [
    (["--workers", "0"], "error: --workers '0': give worker counts >= 1, e.g. 2,4,8"),
    (["--workers", "2", "--timing", "net.yaml"], "error: net.yaml: cannot read the timing JSON"),
    ([], "error: give --nodes N (MPI ranks) or --workers LIST (workers on one host)"),
])
def test_plan_errors_are_one_line(files, args, message):
    proc = layerforge("plan", "--solver", "solver.yaml", *args, cwd=files)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(message) and len(proc.stderr.strip().splitlines()) == 1
