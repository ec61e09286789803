"""Every CUDA source of layerforge/kernels/cuda compiles with nvcc for sm_90, warnings as errors.

Each ``.cu`` file is compiled once per element type the factories instantiate (LF_REAL=float and
double, the defines of :func:`layerforge.kernels.cuda.defines`), in parallel. Skips when nvcc is not on
PATH. This catches syntax and type errors in kernels that cannot run on a machine without a GPU.
"""
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy
import pytest

from layerforge.kernels import cuda

NVCC = shutil.which("nvcc")
DTYPES = (numpy.float32, numpy.float64)
NVCC_FLAGS = ("-arch=sm_90", "-cubin", "-Werror", "all-warnings") + cuda.NVRTC_OPTIONS

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")


def compile_source(path, dtype, out_dir):
    """Run nvcc on one source for one dtype; ``(returncode, diagnostics)``."""
    out = out_dir / f"{path.stem}-{numpy.dtype(dtype).name}.cubin"
    proc = subprocess.run([NVCC, *NVCC_FLAGS, *cuda.defines(dtype), "-o", str(out), str(path)],
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def test_every_source_compiles_for_every_dtype(tmp_path):
    jobs = [(path, dtype) for path in cuda.sources().values() for dtype in DTYPES]
    assert {p.stem for p, _ in jobs} >= {"im2col", "implicit_gemm", "pooling", "lrn", "softmax_loss", "batch_norm"}
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda job: compile_source(*job, tmp_path), jobs))
    failures = [f"{p.name} [{numpy.dtype(d).name}]:\n{msg}" for (p, d), (rc, msg) in zip(jobs, results) if rc != 0]
    assert not failures, "\n\n".join(failures)
    warned = [f"{p.name} [{numpy.dtype(d).name}]: {msg}" for (p, d), (rc, msg) in zip(jobs, results) if msg]
    assert not warned, "\n".join(warned)


def test_kernels_the_launchers_name_exist(tmp_path):
    # every extern "C" entry point a launcher asks for is defined in its source
    wanted = {"im2col": {"im2col", "col2im"},
              "pooling": {"max_pool_forward", "max_pool_backward", "ave_pool_forward", "ave_pool_backward"},
              "lrn": {"lrn_forward", "lrn_backward"},
              "softmax_loss": {"softmax_loss_forward", "softmax_loss_backward"},
              "batch_norm": {"channel_mean_var", "normalize", "channel_grad_sums", "batch_norm_backward"},
              "implicit_gemm": {"conv_forward", "conv_backward_data", "conv_backward_filter"}}
    for stem, names in wanted.items():
        text = cuda.sources()[stem].read_text()
        for name in names:
            assert f'extern "C" __global__ void {name}(' in text, (stem, name)


def test_a_broken_kernel_fails(tmp_path):
    # the check really compiles: a type error in a copy of a kernel is reported with its line
    src = cuda.sources()["lrn"].read_text().replace("T sc = k + alpha_n * acc;", "T sc = k + alpha_n * acc_typo;")
    broken = tmp_path / "broken.cu"
    broken.write_text(src)
    rc, msg = compile_source(broken, numpy.float32, tmp_path)
    assert rc != 0 and "acc_typo" in msg


def test_a_warning_fails(tmp_path):
    # warnings are errors: an unused variable in a kernel fails the build
    src = cuda.sources()["im2col"].read_text().replace("T acc = T(0);", "T acc = T(0);\n        int unused_local = 3;", 1)
    warned = tmp_path / "warned.cu"
    warned.write_text(src)
    rc, msg = compile_source(warned, numpy.float64, tmp_path)
    assert rc != 0, msg
