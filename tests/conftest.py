"""The backends of the tests: numpy, and cupy on a real device where one is present, else on the emulated device.

Without a device, the emulated CUDA device (layerforge_emulator, docs/gpu.md) is installed in this
process for the whole session, through its own API: ``import cupy`` gives the emulator, so every GPU test runs
(``xp`` fixture's ``cupy`` case, ``solver_mode: GPU``, ``Net(..., xp=cupy)``). ``LAYERFORGE_EMULATED_GPU=1`` is set
for the session too, so the processes tests start (``layerforge ... --gpu 0``, CGDP's workers, ``mpiexec`` ranks)
find the same device. A test of what a GPU request does where there is no device takes the :func:`no_gpu` fixture.

Generated data and temporary files go under pytest's temporary folder, and a run that leaves a file in the checkout
fails (tests/checkout.py).
"""
import os
import pathlib
import tempfile

import numpy
import pytest

from layerforge import rng
from layerforge_emulator import install as emulator
from layerforge_emulator.kernel_runner import BUILD_DIR_ENV
from tests import checkout, hydra_files


def _real_device():
    if emulator.is_installed():  # LAYERFORGE_EMULATED_GPU=1 in the environment: the emulator is cupy already
        return False
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no cupy, no driver or no device
        return False


REAL_GPU = _real_device()  # a real cupy with a CUDA device: the cupy cases run there
EMULATED_GPU = not REAL_GPU
if EMULATED_GPU:
    emulator.install()
    os.environ[emulator.ENV] = "1"
BACKENDS = ["numpy", "cupy"]
# what marks a test ``gpu`` (``pytest -m gpu``): words of its id (file, name, parameters), the emulator's own tests,
# and the fixtures that hand it the device
GPU_WORDS = ("gpu", "cuda", "cupy", "device", "nccl")
GPU_FOLDERS = ("tests/emulator/",)
GPU_FIXTURES = ("cupy",)  # tests/emulator/emulated.py's fixture: the emulated cupy for one test


def touches_the_device(item):
    """Whether a collected test runs on the device (a real one or the emulated one): its id (file, name, parameters:
    the ``xp`` fixture's ``[cupy]``, ``solver_mode`` GPU, ``--devices``...) names the GPU, cupy, CUDA, a device or
    NCCL, it is a test of the emulator, or it takes the emulated cupy as a fixture."""
    nodeid = item.nodeid.lower()
    return (any(word in nodeid for word in GPU_WORDS) or nodeid.startswith(GPU_FOLDERS)
            or any(name in GPU_FIXTURES for name in getattr(item, "fixturenames", ())))


def pytest_collection_modifyitems(config, items):
    """``pytest -m gpu`` selects every test that touches the device (docs/gpu.md); ``-m "not gpu"`` the others."""
    for item in items:
        if touches_the_device(item):
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(params=BACKENDS)
def xp(request):
    """The array module a test body runs on: numpy, and cupy (a real device, or the emulated one)."""
    if request.param == "cupy":
        import cupy
        # work an earlier test left queued (a copy into a block it freed, which the pool may hand to this test)
        # runs now, not in the middle of this test, as if each test had a device of its own
        for device in range(cupy.cuda.runtime.getDeviceCount()):
            with cupy.cuda.Device(device):
                cupy.cuda.Device(device).synchronize()
        yield cupy
        cupy.cuda.Device(0).use()  # a test that made another device current does not leave it so
        return
    yield numpy


@pytest.fixture
def no_gpu(monkeypatch):
    """The world without a device, for tests of what a GPU request does there: the emulator is uninstalled for the
    test (``import cupy`` finds the installed cupy, which finds no device, or none) and subprocesses do not ask for
    it. Skips where a real device is present."""
    if REAL_GPU:
        pytest.skip("a GPU is present here")
    monkeypatch.delenv(emulator.ENV, raising=False)
    with emulator.uninstalled():
        yield


@pytest.fixture(scope="session", autouse=True)
def _emulated_kernel_builds(tmp_path_factory):
    """The emulated device's compiled kernels are shared by every test of the session and its subprocesses (the
    engine cache below is per test): each kernel compiles once, as in a cold CI run. A build directory given in
    the environment (to keep builds between sessions) is used as it is."""
    if os.environ.get(BUILD_DIR_ENV):
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(BUILD_DIR_ENV, str(tmp_path_factory.mktemp("emulated_gpu_build")))
        yield


GENERATED_IN_TMP = pytest.StashKey()


@pytest.hookimpl(trylast=True)  # after pytest's own tmpdir plugin has made its factory
def pytest_configure(config):
    """Generated data (the MNIST LMDBs and the Python corpus, which go to ``<checkout>/data`` otherwise:
    layerforge.data.data_dir) and temporary files (``tempfile``, in this process and in the processes tests start)
    go under pytest's temporary folder (Hypothesis's examples too), which a passing run removes (pyproject's
    ``tmp_path_retention_policy``).
    Set before any test module is imported, so an environment a module copies at import has them too. A data
    directory given in the environment is used as it is."""
    factory = config._tmp_path_factory
    mp = config.stash[GENERATED_IN_TMP] = pytest.MonkeyPatch()
    if not os.environ.get("LAYERFORGE_DATA_DIR"):
        mp.setenv("LAYERFORGE_DATA_DIR", str(factory.mktemp("generated_data")))
    temp = str(factory.mktemp("tempfile"))
    mp.setenv("TMPDIR", temp)
    mp.setattr(tempfile, "tempdir", temp)
    from hypothesis.configuration import set_hypothesis_home_dir

    set_hypothesis_home_dir(factory.mktemp("hypothesis"))  # its example database and constants, else ./.hypothesis


def pytest_unconfigure(config):
    mp = config.stash.get(GENERATED_IN_TMP, None)
    if mp is not None:
        mp.undo()


CHECKOUT = pathlib.Path(__file__).resolve().parents[1]
CHECKOUT_FILES = pytest.StashKey()


HYDRA_FILES = pytest.StashKey()


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # xdist's workers leave the check to the controller
        session.config.stash[CHECKOUT_FILES] = checkout.files(CHECKOUT)
        session.config.stash[HYDRA_FILES] = hydra_files.present()


def pytest_sessionfinish(session, exitstatus):
    """The run fails when it wrote into the checkout (tests/checkout.py); skipped outside a git checkout. The
    topology files of the MPI jobs the tests killed are removed (tests/hydra_files.py)."""
    if HYDRA_FILES in session.config.stash:
        hydra_files.remove_orphans(session.config.stash[HYDRA_FILES])
    before = session.config.stash.get(CHECKOUT_FILES, None)
    after = checkout.files(CHECKOUT) if before is not None else None
    made = checkout.made(before, after) if after is not None else []
    base = session.config._tmp_path_factory._basetemp  # a --basetemp inside the checkout is the user's choice
    if base is not None and base.resolve().is_relative_to(CHECKOUT):
        inside = base.resolve().relative_to(CHECKOUT).as_posix() + "/"
        made = [path for path in made if not path.startswith(inside)]
    if made:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"\nFAILED {checkout.report(made)}", red=True)
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def return_freed_memory(collect=True):
    """Hand the heap's free pages back to the system (glibc's malloc_trim; nothing elsewhere), after a garbage
    collection unless ``collect`` is false. The nets a test builds free their blobs, but activations below glibc's
    mmap threshold (up to 32 MiB) are freed into the heap, which keeps them: the fuzzing of ResNet-50's config
    alone held 4 to 12 GiB of this process's RSS."""
    import ctypes
    import gc

    if collect:
        gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@pytest.fixture(scope="module", autouse=True)
def _freed_memory_returned():
    yield
    return_freed_memory()


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same random stream."""
    rng.seed(1234)
    yield


@pytest.fixture(autouse=True)
def _fresh_layerforge_logger():
    """Commands run in-process (train, test, time) install the glog handler and stop propagation; undo that, so
    a later test's caplog sees the "layerforge" records again."""
    import logging

    yield
    logger = logging.getLogger("layerforge")
    for handler in [h for h in logger.handlers if getattr(h, "_layerforge", False)]:
        logger.removeHandler(handler)
    logger.propagate = True
    logger.setLevel(logging.NOTSET)


@pytest.fixture(autouse=True)
def _own_engine_cache(tmp_path_factory, monkeypatch):
    """Each test starts with an empty engine-choice cache of its own (never the user's ~/.cache/layerforge), so
    AUTO times the engines as on a first start unless the test itself fills the cache; nor does it find the
    forward arithmetic an earlier test's nets chose under batch invariance (autotune._SHARED_FORWARD)."""
    from layerforge.kernels import autotune
    monkeypatch.setenv("LAYERFORGE_CACHE_DIR", str(tmp_path_factory.mktemp("engine_cache")))
    monkeypatch.setattr(autotune, "_SHARED_FORWARD", {})
