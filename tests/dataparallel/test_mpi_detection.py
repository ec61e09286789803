"""`mpiexec -n 2 layerforge train` of an SSD head: 2 ranks x batch b == 1 rank x batch 2b (MultiBoxLoss counts the
matches of all the ranks' images), and the detection test's mAP is of all the ranks' detections."""
import re
import subprocess
import sys

import numpy
import pytest
import yaml

from tests.comm.mpirun import ROOT, run_mpi
from tests.layers.test_annotated_data import scenes

pytestmark = pytest.mark.mpi
TOTAL_BATCH = 4


def write_configs(tmp_path, batch, db):
    data = {"type": "AnnotatedData", "top": ["data", "label"],
            "transform": {"scale": 0.01, "mean_value": [100], "resize_param": {"height": 16, "width": 16}},
            "data": {"source": db, "batch_size": batch, "shuffle": False, "decode_workers": 1}}
    net = {"name": "ssd", "layers": [
        dict(data, name="data", include={"phase": "TRAIN"}),
        dict(data, name="data", include={"phase": "TEST"}),
        {"name": "conv", "type": "Convolution", "bottom": "data", "top": "conv",
         "convolution": {"num_output": 4, "kernel_size": 3, "stride": 4, "pad": 1, "weight_filler":
                         {"type": "gaussian", "std": 0.1}}},
        {"name": "loc", "type": "Convolution", "bottom": "conv", "top": "loc",
         "convolution": {"num_output": 8, "kernel_size": 1, "weight_filler": {"type": "gaussian", "std": 0.1}}},
        {"name": "loc_perm", "type": "Permute", "bottom": "loc", "top": "loc_perm", "permute": {"order": [0, 2, 3, 1]}},
        {"name": "loc_flat", "type": "Flatten", "bottom": "loc_perm", "top": "loc_flat"},
        {"name": "conf", "type": "Convolution", "bottom": "conv", "top": "conf",
         "convolution": {"num_output": 4, "kernel_size": 1, "weight_filler": {"type": "gaussian", "std": 0.1}}},
        {"name": "conf_perm", "type": "Permute", "bottom": "conf", "top": "conf_perm",
         "permute": {"order": [0, 2, 3, 1]}},
        {"name": "conf_flat", "type": "Flatten", "bottom": "conf_perm", "top": "conf_flat"},
        {"name": "prior", "type": "PriorBox", "bottom": ["conv", "data"], "top": "prior",
         "prior_box": {"min_size": 6, "max_size": 12, "variance": [0.1, 0.1, 0.2, 0.2]}},
        {"name": "loss", "type": "MultiBoxLoss", "bottom": ["loc_flat", "conf_flat", "prior", "label"], "top": "loss",
         "include": {"phase": "TRAIN"},
         "multibox_loss": {"num_classes": 2, "code_type": "CENTER_SIZE", "overlap_threshold": 0.2}},
        {"name": "conf_reshape", "type": "Reshape", "bottom": "conf_flat", "top": "conf_reshape",
         "include": {"phase": "TEST"}, "reshape": {"shape": {"dim": [0, -1, 2]}}},
        {"name": "conf_softmax", "type": "Softmax", "bottom": "conf_reshape", "top": "conf_softmax",
         "include": {"phase": "TEST"}, "softmax": {"axis": 2}},
        {"name": "conf_out", "type": "Flatten", "bottom": "conf_softmax", "top": "conf_out",
         "include": {"phase": "TEST"}},
        {"name": "out", "type": "DetectionOutput", "bottom": ["loc_flat", "conf_out", "prior"], "top": "out",
         "include": {"phase": "TEST"}, "detection_output": {"num_classes": 2, "code_type": "CENTER_SIZE",
                                                            "nms_param": {"nms_threshold": 0.45}}},
        {"name": "eval", "type": "DetectionEvaluate", "bottom": ["out", "label"], "top": "eval",
         "include": {"phase": "TEST"}, "detection_evaluate": {"num_classes": 2, "overlap_threshold": 0.1}},
    ]}
    (tmp_path / f"net{batch}.yaml").write_text(yaml.safe_dump(net))
    solver = {"net": f"net{batch}.yaml", "type": "SGD", "base_lr": 0.1, "momentum": 0.9, "max_iter": 3,
              "display": 1, "test_iter": [2], "test_interval": 3, "test_initialization": False,
              "eval_type": "detection", "snapshot_prefix": str(tmp_path / f"out{batch}" / "ssd"), "random_seed": 7,
              "dtype": "float64", "cpu_parallel": "threads"}
    path = tmp_path / f"solver{batch}.yaml"
    path.write_text(yaml.safe_dump(solver))
    return path


def final_weights(tmp_path, batch):
    with numpy.load(tmp_path / f"out{batch}" / "ssd_iter_3.npz") as f:
        return {k: f[k] for k in f.files}


def test_two_ranks_equal_one_rank_with_the_whole_batch(tmp_path):
    db = scenes(tmp_path / "db", count=16)
    one = write_configs(tmp_path, TOTAL_BATCH, db)
    proc = subprocess.run([sys.executable, "-m", "layerforge", "train", "--solver", str(one)], capture_output=True,
                          text=True, cwd=ROOT, timeout=180)
    assert proc.returncode == 0, proc.stderr
    two = write_configs(tmp_path, TOTAL_BATCH // 2, db)
    mpi = run_mpi(2, ["-m", "layerforge", "train", "--solver", str(two)], timeout=240)
    assert mpi.returncode == 0, mpi.stderr + mpi.stdout
    expected, got = final_weights(tmp_path, TOTAL_BATCH), final_weights(tmp_path, TOTAL_BATCH // 2)
    for key in expected:
        numpy.testing.assert_allclose(got[key], expected[key], rtol=1e-9, atol=1e-12, err_msg=key)
    score = re.findall(r"Test net output #0: eval = ([-\d.e+]+)", proc.stderr)
    assert score and re.findall(r"Test net output #0: eval = ([-\d.e+]+)", mpi.stderr) == score
