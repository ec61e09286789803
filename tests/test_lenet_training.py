"""The README's first training run: LeNet on the bundled digits reaches >= 97% held-out accuracy."""
import re
import subprocess
import sys

from tests.test_cli import ROOT


def test_lenet_solver_reaches_97_percent(tmp_path):
    # run from tmp_path: the solver's snapshot_prefix (snapshots/lenet) is relative to the working directory
    solver = ROOT / "configs" / "lenet_solver.yaml"
    proc = subprocess.run([sys.executable, "-m", "layerforge", "train", "--solver", str(solver)], capture_output=True,
                          text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    accuracies = [float(a) for a in re.findall(r"Test net output #0: accuracy = ([\d.]+)", proc.stderr)]
    assert len(accuracies) == 5  # iterations 0, 250, 500, 750, 1000
    assert accuracies[0] < 0.2 and accuracies[-1] >= 0.97, accuracies
    assert "Optimization Done." in proc.stderr
    assert (tmp_path / "snapshots" / "lenet_iter_1000.npz").is_file()
