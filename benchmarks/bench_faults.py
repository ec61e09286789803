"""Chaos benchmark: a 4-rank LeNet job loses a random rank at random times and restarts itself; its final parameters
against an uninterrupted run of the same job.

    python benchmarks/bench_faults.py [--ranks 4] [--kills 10] [--max-iter 600] [--snapshot 20] [--seed 0]
                                      [--after 1:6] [--hogs 0] [--workdir DIR] [--json out.json]

One run, side by side:

1. a short run fills the convolution engine cache (its own, in the work directory), so that both jobs compute with
   the same engines on every rank from the first iteration (AUTO's timing would let each job choose anew);
2. the uninterrupted job: ``layerforge train --ranks P`` (LeNet on the bundled MNIST digits, Adam, batch 64 per
   rank, allreduce ``recursive``, a snapshot every ``--snapshot`` iterations);
3. the same job with ``--max-restarts K`` while this script kills a random rank, K times: once the job (or its
   restart) trains, it waits a random time (uniform in ``--after`` seconds), picks a rank at random and SIGKILLs
   its training process (what the out-of-memory killer does) or, one time in four, the rank's supervisor.

Per restart it reports the rank and process killed, the iteration the job had reached (the last logged; display is
every iteration), the iteration it resumed from, the iterations lost (at most the snapshot interval), whether a newer
whole snapshot had been there to resume from (a lost snapshot), and the seconds from the kill to the first iteration
of the restarted job; then the final parameters of both jobs, compared bit for bit, and their wall times.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = "BENCH_FAULTS_JOB"
RESTARTED = re.compile(r"restart (\d+) of \d+: (.*); resuming from (?:\S+_iter_(\d+)\.solverstate\.npz|the start)")
ITERATION = re.compile(r"\] Iteration (\d+) \(")
SOLVER = """\
net: {net}
type: Adam
base_lr: 0.001
momentum: 0.9
momentum2: 0.999
lr_policy: fixed
display: 1
max_iter: {max_iter}
snapshot: {snapshot}
snapshot_prefix: {prefix}
random_seed: 1
allreduce: recursive
"""


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--max-iter", type=int, default=600)
    p.add_argument("--snapshot", type=int, default=20)
    p.add_argument("--seed", type=int, default=0, help="seed of the kills' ranks and times")
    p.add_argument("--after", default="1:6", help="seconds A:B: each kill comes uniformly in [A, B] s after the job "
                                                  "(or its restart) trains")
    p.add_argument("--hogs", type=int, default=0, help="CPU hogs (while True: pass) beside the jobs")
    p.add_argument("--workdir", help="keep snapshots and logs here (default: a temporary directory)")
    p.add_argument("--json", help="write the results here")
    return p.parse_args()


def processes(marker):
    """``{(rank, kind): pid}`` of the job carrying ``marker``: kind ``supervisor`` or ``child``."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if env.get(MARKER.encode()) != marker.encode() or b"PMI_RANK" not in env:
            continue
        found[int(entry)] = (int(env[b"PMI_RANK"]), ppid, b"LAYERFORGE_SUPERVISED" in env)
    pids = {}
    for pid, (rank, ppid, supervised) in found.items():
        if not supervised:
            pids[(rank, "supervisor")] = pid
        elif ppid in found and not found[ppid][2]:
            pids[(rank, "child")] = pid
    return pids


class Job:
    """``layerforge train`` as a child of this script; its stderr kept, line by line, with arrival times (monotonic
    and wall clock)."""

    def __init__(self, argv, env, log_path):
        self.marker = f"{os.getpid()}-{time.monotonic_ns()}"
        self.lines, self.started = [], time.monotonic()
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=dict(env, **{MARKER: self.marker}), text=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append((time.monotonic(), time.time(), line))
            self.log.write(line)

    def wait(self):
        code = self.proc.wait()
        self.reader.join()
        self.log.close()
        return code, time.monotonic() - self.started

    def end(self):
        for pid in processes(self.marker).values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)


def train_argv(solver, *more):
    return [sys.executable, "-m", "layerforge", "train", "--solver", solver, "--no-progress", *map(str, more)]


def run(argv, env, log_path):
    job = Job(argv, env, log_path)
    code, seconds = job.wait()
    if code != 0:
        sys.exit(f"{argv}: exit {code}; see {log_path}")
    return seconds


def weights(path):
    with numpy.load(path) as f:
        return {k: f[k] for k in f.files}


def chaos(args, solver, env, log_path, rng):
    """The job with restarts while ranks are killed; returns (wall seconds, [kill records], the job's lines)."""
    lo, hi = (float(v) for v in args.after.split(":"))
    job = Job(train_argv(solver, "--ranks", args.ranks, "--max-restarts", args.kills), env, log_path)
    kills = []
    try:
        for k in range(args.kills):
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and job.proc.poll() is None:  # this attempt trains
                lines = [line for _, _, line in job.lines]
                starts = [i for i, line in enumerate(lines) if RESTARTED.search(line)]  # the k-th restart trains
                if len(starts) == k and any(ITERATION.search(line) for line in lines[starts[-1] if k else 0:]):
                    break
                time.sleep(0.05)
            time.sleep(rng.uniform(lo, hi))
            if job.proc.poll() is not None:
                break
            rank = rng.randrange(args.ranks)
            kind = "supervisor" if rng.random() < 0.25 else "child"  # the out-of-memory killer picks the child
            pid = processes(job.marker).get((rank, kind))
            if pid is None:
                continue
            os.kill(pid, signal.SIGKILL)
            kills.append({"rank": rank, "process": kind, "pid": pid, "time": time.monotonic()})
        code, seconds = job.wait()
    finally:
        job.end()
    if code != 0:
        sys.exit(f"the job with restarts ended with exit {code}; see {log_path}")
    return seconds, kills, job.lines


def restarts_of(lines, kills, snapshot, prefix):
    """Per restart line of the job: the kill before it, the iteration reached (the last logged before it), where it
    resumed, the iterations lost, whether a newer whole snapshot had been written by then (a lost snapshot), and the
    seconds from the kill to the restarted job's first iteration."""
    rows, reached = [], 0
    for t, wall, line in lines:
        found = ITERATION.search(line)
        if found:
            reached = int(found.group(1))
            if rows and rows[-1]["resumed_s"] is None:
                rows[-1]["resumed_s"] = t - rows[-1]["kill_time"]
            continue
        found = RESTARTED.search(line)
        if not found:
            continue
        before = [k for k in kills if k["time"] < t]
        resumed = int(found.group(3) or 0)
        newer = [f"{prefix}_iter_{i}.solverstate.npz" for i in range(resumed + snapshot, reached + 1, snapshot)]
        rows.append({"restart": int(found.group(1)), "cause": found.group(2),
                     "killed": f"rank {before[-1]['rank']} {before[-1]['process']}" if before else "?",
                     "reached": reached, "resumed": resumed, "lost": max(0, reached - resumed),
                     "lost_snapshot": any(os.path.exists(p) and os.path.getmtime(p) < wall for p in newer),
                     "kill_time": before[-1]["time"] if before else t, "resumed_s": None})
    return rows


def main():
    args = parse_args()
    rng = random.Random(args.seed)
    work = args.workdir or tempfile.mkdtemp(prefix="bench-faults-")
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               LAYERFORGE_CACHE_DIR=os.path.join(work, "cache"))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    try:
        solvers = {}
        for name in ("warm", "reference", "chaos"):
            snap = os.path.join(work, name)
            shutil.rmtree(snap, ignore_errors=True)
            os.makedirs(snap)
            solvers[name] = os.path.join(work, f"{name}.yaml")
            with open(solvers[name], "w") as f:
                f.write(SOLVER.format(net=os.path.join(ROOT, "configs", "lenet.yaml"), max_iter=args.max_iter,
                                      snapshot=args.snapshot, prefix=os.path.join(snap, "lenet")))
        load = os.getloadavg()[0]
        run(train_argv(solvers["warm"], "--ranks", args.ranks, "--max-iter", 8), env, os.path.join(work, "warm.log"))
        reference_s = run(train_argv(solvers["reference"], "--ranks", args.ranks), env,
                          os.path.join(work, "reference.log"))
        chaos_s, kills, lines = chaos(args, solvers["chaos"], env, os.path.join(work, "chaos.log"), rng)
    finally:
        for h in hogs:
            h.kill()
    final = f"lenet_iter_{args.max_iter}.npz"
    expected, got = weights(os.path.join(work, "reference", final)), weights(os.path.join(work, "chaos", final))
    identical = all(numpy.array_equal(expected[k], got[k]) for k in expected)
    largest = max(float(numpy.abs(expected[k] - got[k]).max()) for k in expected)
    rows = restarts_of(lines, kills, args.snapshot, os.path.join(work, "chaos", "lenet"))

    print(f"# {args.ranks}-rank LeNet (Adam, batch 64 per rank), {args.max_iter} iterations, a snapshot every "
          f"{args.snapshot}; {len(kills)} kills (seed {args.seed}, each {args.after} s after the job trains); "
          f"load {load:.1f} at the start, {args.hogs} CPU hogs beside; work directory {work}")
    print("| restart | killed | cause logged | reached | resumed from | iterations lost | lost snapshot | kill -> "
          "training again (s) |")
    print("|---:|---|---|---:|---:|---:|---|---:|")
    for r in rows:
        resumed_s = f"{r['resumed_s']:.1f}" if r["resumed_s"] is not None else "-"
        print(f"| {r['restart']} | {r['killed']} | {r['cause']} | {r['reached']} | {r['resumed']} | {r['lost']} | "
              f"{'yes' if r['lost_snapshot'] else 'no'} | {resumed_s} |")
    lost = [r["lost"] for r in rows]
    print(f"restarts {len(rows)} for {len(kills)} kills; iterations lost per restart: max {max(lost, default=0)}, "
          f"mean {numpy.mean(lost) if lost else 0:.1f} (snapshot interval {args.snapshot}); lost snapshots "
          f"{sum(r['lost_snapshot'] for r in rows)}")
    print(f"| job | wall s | final parameters |")
    print(f"|---|---:|---|")
    print(f"| uninterrupted | {reference_s:.1f} | reference |")
    print(f"| {len(kills)} kills, restarted | {chaos_s:.1f} | "
          f"{'bit-identical' if identical else f'differ (max |diff| {largest:.3g})'} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": args.ranks, "max_iter": args.max_iter, "snapshot": args.snapshot, "seed": args.seed,
                       "kills": [{k: v for k, v in kill.items() if k != "time"} for kill in kills],
                       "restarts": [{k: v for k, v in r.items() if k not in ("kill_time", "logged")} for r in rows],
                       "identical": identical, "max_abs_diff": largest, "reference_s": reference_s,
                       "chaos_s": chaos_s, "load": load, "hogs": args.hogs}, f, indent=1)
    return 0 if identical and len(rows) == len(kills) and not any(r["lost_snapshot"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
