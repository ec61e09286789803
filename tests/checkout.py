"""What a test run leaves in the checkout: nothing. The session records the checkout's untracked and ignored files
at its start (``git status``) and fails at its end when one appeared or changed (a snapshot, an LMDB: tests write
under pytest's tmp_path; generated data and temporary files are sent there by tests/conftest.py). Tracked files
are left out (a developer edits them while the suite runs), and so are tools' own caches (``__pycache__``,
``.pytest_cache``, virtual environments, ``*.egg-info``)."""
import os
import subprocess

# virtual environments are skipped by git itself (a CI venv in the checkout holds tens of thousands of files)
PATHSPEC = [".", ":(exclude).venv*"]
TOOL_CACHES = {"__pycache__", ".pytest_cache"}


def files(root):
    """``{path: mtime_ns}`` of the untracked and ignored files under the git checkout ``root``, or None where
    ``root`` is not a git checkout (or git is missing)."""
    try:
        proc = subprocess.run(["git", "status", "--porcelain=v1", "-z", "--ignored", "--untracked-files=all",
                               "--no-renames", "--", *PATHSPEC], cwd=root, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    found = {}
    for entry in proc.stdout.split("\0"):
        status, path = entry[:2], entry[3:]
        parts = path.split("/")
        cache = TOOL_CACHES.intersection(parts) or any(p.endswith(".egg-info") for p in parts)
        if status not in ("??", "!!") or cache:
            continue
        try:
            found[path] = os.stat(os.path.join(root, path)).st_mtime_ns
        except OSError:  # removed since git listed it
            continue
    return found


def made(before, after):
    """The paths of ``after`` that are new or changed since ``before`` (both from :func:`files`), sorted."""
    return sorted(path for path, mtime in after.items() if before.get(path, -1) != mtime)


def report(paths, limit=20):
    """One message naming what the run left in the checkout."""
    shown = ", ".join(paths[:limit]) + (f" and {len(paths) - limit} more" if len(paths) > limit else "")
    return (f"the test run wrote {len(paths)} file(s) into the checkout (tests must write under tmp_path): "
            f"{shown}")
