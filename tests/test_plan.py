"""`layerforge plan`: the alpha-beta-gamma projection, checked against hand-computed values."""
import json
import subprocess
import sys

import pytest

from tests.test_cli import ROOT

N_BYTES = 431_080 * 4  # LeNet's gradients in float32
COST = "1e-5,1e-9,4e-9,1e-10"


def plan(tmp_path, *extra, timing_figures=None):
    timing = tmp_path / "timing.json"
    timing.write_text(json.dumps(timing_figures or {"forward_backward_ms": 100.0}))
    proc = subprocess.run([sys.executable, "-m", "layerforge", "plan", "--solver", "configs/lenet_solver.yaml",
                           "--timing", str(timing), "--cost", COST, "--json", *map(str, extra)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_plan_matches_the_cost_formulas(tmp_path):
    result = plan(tmp_path, "--nodes", 4, "--group", 2)
    assert result["gradient_bytes"] == N_BYTES
    rows = {r["algorithm"]: r for r in result["rows"]}
    n, a, bi, bx, g = N_BYTES, 1e-5, 1e-9, 4e-9, 1e-10
    recursive = 4 * a + 2 * n * (1 * bi + 2 * bx) / 4 + n * 3 / 4 * g   # P = 4, L = 2, q = 2
    topology = 4 * a + 2 * n * (2 * bi + 1 * bx) / 4 + n * 3 / 4 * g
    assert rows["recursive"]["allreduce_ms"] == pytest.approx(recursive * 1e3, rel=1e-9)
    assert rows["topology"]["allreduce_ms"] == pytest.approx(topology * 1e3, rel=1e-9)
    eff = 100.0 / (100.0 + topology * 1e3)
    assert rows["topology"]["efficiency"] == pytest.approx(eff, rel=1e-9)
    assert rows["topology"]["speedup"] == pytest.approx(4 * eff, rel=1e-9)
    assert rows["topology"]["images_per_s"] == pytest.approx(4 * 64 / ((100.0 + topology * 1e3) / 1e3), rel=1e-9)


@pytest.mark.parametrize("backward_ms", [5.0, 60.0])
def test_plan_overlapped_and_double_buffered_iterations(tmp_path, backward_ms):
    # 4 ranks, one per group, slow links: topology's allreduce is ~13 ms; forward 40 ms
    result = plan(tmp_path, "--nodes", 4, "--group", 1, timing_figures={
        "forward_backward_ms": 40.0 + backward_ms, "forward_ms": 40.0, "backward_ms": backward_ms})
    for r in result["rows"]:
        ar = r["allreduce_ms"]
        assert r["iteration_ms"] == pytest.approx(40.0 + backward_ms + ar, rel=1e-12)
        assert r["overlapped_ms"] == pytest.approx(40.0 + max(backward_ms, ar), rel=1e-12)
        assert r["double_buffered_ms"] == pytest.approx(max(40.0 + backward_ms, ar), rel=1e-12)
    topology = next(r for r in result["rows"] if r["algorithm"] == "topology")
    hidden = topology["iteration_ms"] - topology["overlapped_ms"]
    assert hidden == pytest.approx(min(backward_ms, topology["allreduce_ms"]), rel=1e-9) and hidden > 4


def test_plan_at_swcaffe_scale(tmp_path):
    rows = {r["algorithm"]: r for r in plan(tmp_path, "--nodes", 1024, "--group", 256)["rows"]}
    # with slower links between groups, keeping the big steps inside groups must win
    assert rows["topology"]["allreduce_ms"] < rows["recursive"]["allreduce_ms"]
    assert all(0 < r["efficiency"] <= 1 for r in rows.values())


def test_plan_rejects_bad_cost(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "layerforge", "plan", "--solver", "configs/lenet_solver.yaml",
                           "--nodes", "4", "--cost", "1,2"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: --cost '1,2': give four numbers alpha,beta_intra,beta_inter,gamma"


def test_plan_includes_the_sparse_paths_of_an_embedding(tmp_path):
    # 4 x 3 tokens, all id 2: one row per rank and one in the sum; the table leaves the dense allreduce
    net = {"name": "embed_plan", "layers": [
        {"name": "tokens", "type": "DummyData", "top": ["tokens", "label"],
         "dummy_data": {"shape": [[4, 3], [4]], "data_filler": [{"type": "constant", "value": 2},
                                                               {"type": "constant", "value": 0}]}},
        {"name": "embed", "type": "Embed", "bottom": "tokens", "top": "embed",
         "embed": {"num_output": 10, "input_dim": 1000}},
        {"name": "ip", "type": "InnerProduct", "bottom": "embed", "top": "ip", "inner_product": {"num_output": 3}},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"], "top": "loss"}]}
    (tmp_path / "net.yaml").write_text(json.dumps(net))
    (tmp_path / "solver.yaml").write_text(json.dumps({"net": "net.yaml"}))
    timing = tmp_path / "timing.json"
    timing.write_text(json.dumps({"forward_backward_ms": 10.0}))
    proc = subprocess.run([sys.executable, "-m", "layerforge", "plan", "--solver", str(tmp_path / "solver.yaml"),
                           "--timing", str(timing), "--cost", COST, "--json", "--nodes", "4", "--group", "2"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["gradient_bytes"] == (10 + 3 * 30 + 3) * 4
    [sparse] = result["sparse"]
    assert (sparse["rows_per_rank"], sparse["rows_in_sum"], sparse["num_rows"]) == (1, 1, 1000)
    a, bx, g = 1e-5, 4e-9, 1e-10 * 8  # two groups: the slow link; 8 = COMBINE_FACTOR
    allgather = 2 * 2 * a + 3 * (40 + 8) * bx + 4 * 40 * g
    assert sparse["ms"]["allgather"] == pytest.approx(allgather * 1e3, rel=1e-9)
    assert sparse["chosen"] == "allgather" and sparse["ms"]["dense"] > sparse["ms"]["allgather"]
    rows = {r["algorithm"]: r for r in result["rows"]}
    assert rows["ring"]["allreduce_ms"] > sparse["ms"]["allgather"]


def test_plan_takes_the_calibration_of_its_rank_count_or_says_which_it_took(tmp_path, monkeypatch):
    from layerforge.commands.plan import load_cost_params
    from layerforge.comm.cost_model import CACHE_ENV

    entry = {"alpha": 1e-5, "beta_intra": 1e-9, "beta_inter": 4e-9, "gamma": 1e-10}
    table = {"h|p=2|groups=1x2|mpich": dict(entry, alpha=2e-5), "h|p=4|groups=1x4|mpich": entry}
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv(CACHE_ENV, str(path))
    params, source = load_cost_params(None, 2)
    assert params.alpha == 2e-5 and source == f"{path} [h|p=2|groups=1x2|mpich]"
    params, source = load_cost_params(None, 1024)
    assert params.alpha == 1e-5
    assert source == (f"{path} [h|p=4|groups=1x4|mpich], measured with 4 ranks, not 1024: `mpiexec -n 1024 layerforge "
                      "bench_allreduce` measures these")
