"""tests/checkout.py: the check that a test run leaves the checkout as it found it."""
import os
import subprocess

import pytest

from tests import checkout


def git(root, *args):
    subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args], cwd=root, check=True,
                   capture_output=True)


@pytest.fixture
def repo(tmp_path):
    (tmp_path / ".gitignore").write_text("snapshots/\n*.egg-info/\n")
    (tmp_path / "tracked.txt").write_text("a\n")
    (tmp_path / "snapshots").mkdir()
    (tmp_path / "snapshots" / "user_iter_10.npz").write_bytes(b"user's")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".gitignore", "tracked.txt")
    git(tmp_path, "commit", "-q", "-m", "start")
    return tmp_path


def test_new_and_rewritten_untracked_and_ignored_files_are_named_and_tracked_files_and_caches_are_not(repo):
    before = checkout.files(repo)
    assert before is not None and set(before) == {"snapshots/user_iter_10.npz"}
    (repo / "snapshots" / "lenet_iter_1000.npz").write_bytes(b"suite's")  # ignored by git, still made by the run
    (repo / "solver_iter_6.npz").write_bytes(b"")
    (repo / "tracked.txt").write_text("b\n")  # a developer's edit during the run
    os.utime(repo / "snapshots" / "user_iter_10.npz", ns=(1, 1))  # the user's snapshot overwritten
    for cache in ("__pycache__", ".pytest_cache", ".venv-ci", "layerforge.egg-info"):
        (repo / cache).mkdir()
        (repo / cache / "x").write_text("")
    made = checkout.made(before, checkout.files(repo))
    assert made == ["snapshots/lenet_iter_1000.npz", "snapshots/user_iter_10.npz", "solver_iter_6.npz"]
    assert checkout.report(made, limit=2) == (
        "the test run wrote 3 file(s) into the checkout (tests must write under tmp_path): "
        "snapshots/lenet_iter_1000.npz, snapshots/user_iter_10.npz and 1 more")


def test_an_untouched_checkout_gives_nothing_and_a_folder_outside_git_is_skipped(repo, tmp_path_factory):
    assert checkout.made(checkout.files(repo), checkout.files(repo)) == []
    outside = tmp_path_factory.mktemp("not_a_checkout")
    if subprocess.run(["git", "rev-parse"], cwd=outside, capture_output=True).returncode == 0:
        pytest.skip("pytest's temporary folder is inside a git checkout (--basetemp)")
    assert checkout.files(outside) is None


def test_temporary_files_and_generated_data_go_under_pytest_s_folder(tmp_path_factory):
    import tempfile

    from layerforge.data import data_dir

    base = str(tmp_path_factory.getbasetemp())
    assert tempfile.gettempdir().startswith(base) and os.environ["TMPDIR"].startswith(base)
    assert data_dir().startswith(base) or os.environ.get("LAYERFORGE_DATA_DIR") == data_dir()
