"""A training job that restarts itself after a lost rank, as torchrun's ``--max-restarts`` (and Horovod's elastic mode).

Under ``mpiexec`` a rank that dies (killed, out of memory, its host gone) ends the whole job: hydra kills the other
ranks, and MPI has no way to go on without one. So the restarts are made from outside the job:
``layerforge train --ranks P --max-restarts N`` starts ``mpiexec -n P layerforge train ...`` itself (one process,
without mpiexec, when ``--ranks`` is not given), passes through everything the job prints, and when the job fails:

1. names the cause in one line: the rank and the signal that killed it (its supervisor's report,
   layerforge/dataparallel/supervisor.py), or a host that no longer answers;
2. with a hostfile, asks every host of it whether it answers (a one-process mpiexec on it, within
   :data:`PROBE_SECONDS`) and keeps those that do;
3. finds the newest snapshot the job wrote (every snapshot is written atomically, so the newest one that loads is
   whole) and starts the job again from it: the iteration, the update history, every rank's random stream, read
   positions and engine choices (layerforge/solvers/snapshot.py), so a restart on as many ranks trains exactly as
   the job would have without the failure, bit for bit, losing only the iterations since that snapshot;
4. on fewer hosts, and where ``--min-ranks`` allows, restarts on a smaller world that keeps the global batch
   (ranks x batch x iter_size): the largest P' <= the ranks the live hosts hold that divides P x iter_size, with
   iter_size raised to P x iter_size / P' (see :func:`smaller_world`).

Not restarted: a job that ends well (exit 0, a requested stop included), a user's error the job named (``error:
...``: the same input fails again), a job stopped by this process's own SIGINT / SIGTERM (passed on to the job,
which snapshots and stops), and any failure after ``max_restarts`` restarts.
"""
import argparse
import contextlib
import glob
import logging
import os
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ..errors import LayerforgeError

log = logging.getLogger("layerforge")

USER_ERROR_STATUS = 2  # what a job exits with when the user's input is at fault
RESTART_ENV = "LAYERFORGE_RESTART"  # in a job started here: its attempt (0 first); such a job never restarts itself
PROBE_SECONDS = 15.0  # a host that has not run one process within this long is lost
KILLED = re.compile(r"^rank (\d+) \(host (\S+), pid (\d+)\): killed by signal (\d+) \((\w+)\)")
USER_ERROR = re.compile(r"^(?:rank \d+: )?error: ")
RANK_FAILED = re.compile(r"^rank (\d+): (.+)$")
TIMED_OUT = re.compile(r"^rank \d+: .* within the collective timeout of ")  # comm/deadline.py's last line
ITERATION = re.compile(r"\] Iteration (\d+) \(")
TRAINING = re.compile(r"\] Solving ")
# hydra's report of a rank process (a supervisor) that ended badly; it names the pid and host, not the rank
HYDRA_PID = re.compile(r"^=\s+PID (\d+) RUNNING AT (\S+)")
HYDRA_SIGNAL = re.compile(r"EXIT STRING: \w[\w ]* \(signal (\d+)\)")
STATE = re.compile(r"_iter_(\d+)\.solverstate\.npz$")


def add_restart_arguments(parser):
    """``--ranks``, ``--hostfile``, ``--mpiexec``, ``--max-restarts``, ``--min-ranks`` (train)."""
    parser.add_argument("--ranks", type=int, metavar="P",
                        help="run the job on P MPI ranks, starting mpiexec itself (what --max-restarts needs to "
                             "restart a job of several ranks)")
    parser.add_argument("--hostfile", metavar="FILE",
                        help="with --ranks: hydra's hostfile (host or host:slots per line) to place the ranks on; a "
                             "restart leaves out the hosts that no longer answer")
    parser.add_argument("--mpiexec", metavar="COMMAND",
                        help="with --ranks: the mpiexec command and its options, before -n (default: the mpiexec "
                             "beside this Python)")
    parser.add_argument("--max-restarts", type=int, metavar="N",
                        help="restart the job from its last snapshot when a rank dies, up to N times (overrides the "
                             "solver's max_restarts; docs/distributed.md)")
    parser.add_argument("--min-ranks", type=int, metavar="M",
                        help="with --hostfile: restart on fewer ranks, down to M, when hosts are lost (the global "
                             "batch is kept by raising iter_size; default: only on all the ranks)")


def job_arguments(argv):
    """``argv`` (train's command line) without what this module reads: the restart options, and ``--snapshot`` /
    ``--weights`` / ``--iter-size``, which each start of the job sets itself."""
    own = argparse.ArgumentParser(add_help=False)
    add_restart_arguments(own)
    for name in ("--snapshot", "--weights", "--iter-size"):
        own.add_argument(name)
    return own.parse_known_args(argv)[1]


def refuse_under_mpiexec(args):
    """Under mpiexec, ``--ranks`` / ``--max-restarts`` cannot work (hydra ends the job with its first lost rank):
    say what to run instead."""
    if args.ranks is not None or args.max_restarts is not None:
        raise LayerforgeError("--ranks / --max-restarts start mpiexec themselves, so that a job that lost a rank can "
                              "be started again: run `layerforge train --ranks P --max-restarts N ...` without "
                              "mpiexec (under mpiexec a lost rank ends the job)")


def note_under_mpiexec(sp):
    """Rank 0 of a job under mpiexec that no restarting parent started: say that the solver's max_restarts
    cannot act there."""
    if sp.max_restarts and os.environ.get(RESTART_ENV) is None:
        log.warning("max_restarts %d: under mpiexec a lost rank ends the job; `layerforge train --ranks P` starts "
                    "mpiexec itself and restarts it", sp.max_restarts)


def wants_restarts(args, sp):
    """True when ``layerforge train`` (not under mpiexec) runs its job from here: ``--ranks``, or restarts of one
    process (``--max-restarts`` or the solver's ``max_restarts``)."""
    if os.environ.get(RESTART_ENV) is not None:
        return False  # a job this module started
    for name in ("hostfile", "mpiexec", "min_ranks"):
        if getattr(args, name) is not None and args.ranks is None:
            raise LayerforgeError(f"--{name.replace('_', '-')} goes with --ranks P (the ranks layerforge starts)")
    if args.ranks is not None and args.ranks < 1:
        raise LayerforgeError(f"--ranks {args.ranks}: give at least 1")
    return args.ranks is not None or restarts_of(args, sp) > 0


def restarts_of(args, sp):
    """How many restarts: ``--max-restarts``, else the solver's ``max_restarts``."""
    if args.max_restarts is not None and args.max_restarts < 0:
        raise LayerforgeError(f"--max-restarts {args.max_restarts}: give 0 or more")
    return args.max_restarts if args.max_restarts is not None else sp.max_restarts


def read_hostfile(path):
    """``[(host, slots), ...]`` of a hydra hostfile (``host`` or ``host:slots`` per line, ``#`` comments)."""
    hosts = []
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise LayerforgeError(f"{path}: cannot read the hostfile ({e.strerror})") from None
    for number, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, slots = line.partition(":")
        if not name or (slots and not slots.isdigit()) or slots == "0" or " " in name:
            raise LayerforgeError(f"{path}:{number}: expected 'host' or 'host:slots', got {line!r}")
        hosts.append((name, int(slots or 1)))
    if not hosts:
        raise LayerforgeError(f"{path}: the hostfile names no host")
    return hosts


def smaller_world(ranks, iter_size, available, min_ranks):
    """The world a restart runs on when only ``available`` ranks are left: ``(P', iter_size')`` with P' the largest
    count <= ``available`` (and <= ``ranks``, >= ``min_ranks``) that divides ``ranks x iter_size``, and iter_size'
    = ranks x iter_size / P', so that P' ranks x batch x iter_size' is the global batch the job was started with;
    None when no such count is left."""
    total = ranks * iter_size
    for p in range(min(available, ranks), max(min_ranks, 1) - 1, -1):
        if total % p == 0:
            return p, total // p
    return None


def latest_snapshot(prefix, since):
    """``(path, iteration)`` of the newest solver state ``PREFIX_iter_N.solverstate.npz`` written at ``since`` (a
    time.time()) or later that loads, with its weights file; None when there is none."""
    from ..npz import load_npz

    found = []
    for path in glob.glob(glob.escape(prefix) + "_iter_*.solverstate.npz"):
        match = STATE.search(path)
        try:
            fresh = os.path.getmtime(path) >= since
        except OSError:
            continue
        if match and fresh:
            found.append((int(match.group(1)), path))
    for iteration, path in sorted(found, reverse=True):
        try:
            weights = load_npz(path)["learned_net"].item()
        except Exception:  # noqa: BLE001 - a state that does not load is not a place to resume from
            continue
        if os.path.exists(os.path.join(os.path.dirname(path), weights)):
            return path, iteration
    return None


class Job:
    """One start of the job: its process, what it printed that says how it ended, and the last iteration logged."""

    def __init__(self, argv, env):
        from .supervisor import child_preexec

        self.attempt = env[RESTART_ENV]
        self.first_gone = None  # [(rank, pid)] of the first rank supervisor on this host to end, once watched
        self.hydra = {}

        # a process group of its own: a terminal's Ctrl-C reaches mpiexec once, through this process (twice, and
        # hydra would end the job at once); and it dies with this process
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, errors="replace", preexec_fn=child_preexec)
        self.killed, self.failures, self.user_error, self.iteration = [], [], None, None
        self.timed_out = False
        self._readers = [threading.Thread(target=self._pass_on, args=(pipe, out), daemon=True)
                         for pipe, out in ((self.proc.stdout, sys.stdout), (self.proc.stderr, sys.stderr))]
        for reader in self._readers:
            reader.start()

    def _pass_on(self, pipe, out):
        """Write what the job prints on ``pipe`` to ``out`` (ours), noting what tells how it ends (hydra writes its
        report on stdout, the ranks theirs on stderr)."""
        for line in pipe:
            out.write(line)
            out.flush()
            text = line.strip()
            found = KILLED.match(text)
            if found:
                self.killed.append(found)
            elif USER_ERROR.match(text):
                self.user_error = self.user_error or text
            elif RANK_FAILED.match(text):
                self.failures.append(text)
                self.timed_out = self.timed_out or bool(TIMED_OUT.match(text))
            for key, pattern in (("pid", HYDRA_PID), ("signal", HYDRA_SIGNAL)):
                found = pattern.search(text)
                if found and key not in self.hydra:
                    self.hydra[key] = found
            found = ITERATION.search(text)
            if found:
                self.iteration = int(found.group(1))
            if self.first_gone is None and TRAINING.search(text):
                self.first_gone = []
                threading.Thread(target=self._watch, args=(_supervisors_here(self.attempt),), daemon=True).start()

    def _watch(self, ranks):
        """Note the first of this host's rank supervisors (``{pid: rank}``) to end: hydra's report of a supervisor
        that died without a word names the job's first process, whichever died, and the kernel tells the end of a
        process (its pidfd becomes readable) before hydra can end the others."""
        fds = {}
        for pid, rank in ranks.items():
            try:
                fds[os.pidfd_open(pid)] = (rank, pid)
            except (OSError, AttributeError):  # already gone, or no pidfd here (Linux < 5.3, not Linux)
                continue
        try:
            poll = select.poll()
            for fd in fds:
                poll.register(fd, select.POLLIN)
            while fds and self.proc.poll() is None:
                ready = poll.poll(500)
                if ready:
                    self.first_gone.append(fds[ready[0][0]])
                    return
        finally:
            for fd in fds:
                os.close(fd)

    def wait(self):
        code = self.proc.wait()
        for reader in self._readers:
            reader.join()
        return code

    def status(self, code):
        """The job's exit status, the same from run to run where the job said what happened: hydra's own status
        mixes the ranks' (the one that reported, and those it killed, in the order they ended)."""
        from ..comm.deadline import EXIT_STATUS

        if code and self.timed_out:
            return EXIT_STATUS
        if code and self.killed:
            return 128 + int(self.killed[0].group(4))
        return code

    def cause(self, code):
        """One line: which rank died and why (the first death reported), else how the job ended."""
        if self.killed:
            k = self.killed[0]
            return f"rank {k.group(1)} (host {k.group(2)}, pid {k.group(3)}) killed by signal {k.group(4)} ({k.group(5)})"
        if self.proc.returncode < 0:
            signum = -self.proc.returncode
            return f"the job (pid {self.proc.pid}) was killed by signal {signum} ({signal.Signals(signum).name})"
        if self.first_gone:  # the first rank of this host to end: its own report, else its supervisor died
            rank, pid = self.first_gone[0]
            said = [line for line in self.failures if line.startswith(f"rank {rank}: ")]
            return said[0] if said else f"rank {rank} (host {socket.gethostname()}, pid {pid}): its supervisor " \
                                        f"died without a report (SIGKILL, or a crash)"
        if "pid" in self.hydra:  # on another host: hydra's report names a process, not necessarily the first to end
            return f"a rank ended without a report; hydra's report: pid {self.hydra['pid'].group(1)} on host " \
                   f"{self.hydra['pid'].group(2)}" + (f", {self.hydra['signal'].group(0).split(': ', 1)[1]}"
                                                      if "signal" in self.hydra else "")
        if self.failures:
            return self.failures[0]
        return f"the job ended with exit status {code}"


def train_with_restarts(argv, sp, ranks=None, hostfile=None, mpiexec=None, max_restarts=0, min_ranks=None,
                        snapshot=None, weights=None):
    """Run ``layerforge train argv`` (train's command line, :func:`job_arguments` takes out what is read here) as a
    job of ``ranks`` MPI ranks (None: one process) and restart it after a failure, up to ``max_restarts`` times;
    returns the exit status. ``sp``: the solver's SolverParameter (snapshot prefix and interval, iter_size);
    ``snapshot`` / ``weights``: where the first start begins (train's ``--snapshot`` / ``--weights``)."""
    from ..solvers.snapshot import snapshot_prefix

    hosts = read_hostfile(hostfile) if hostfile else None
    launcher = shlex.split(mpiexec) if mpiexec else [_find_mpiexec()]
    min_ranks = ranks if min_ranks is None or ranks is None else min_ranks
    if ranks is not None and not 1 <= min_ranks <= ranks:
        raise LayerforgeError(f"--min-ranks {min_ranks}: give a count from 1 to --ranks {ranks}")
    if max_restarts and not sp.snapshot:
        log.warning("max_restarts %d without snapshot: a restart starts again from the beginning", max_restarts)
    base = job_arguments(argv)
    prefix = os.path.abspath(snapshot_prefix(sp))
    started = time.time() - 1.0  # the file system's times may be coarser than time.time()'s
    world, iter_size, live, resume, code = ranks, sp.iter_size, hosts, None, 0
    with tempfile.TemporaryDirectory(prefix="layerforge-restarts-") as scratch, _signals_passed_on() as stop:
        for attempt in range(max_restarts + 1):
            if stop.requested:  # between two starts: nothing runs that could snapshot
                return code
            argv_now = base + (["--snapshot", resume] if resume else
                               ["--snapshot", snapshot] if snapshot else ["--weights", weights] if weights else [])
            argv_now += ["--iter-size", str(iter_size)]  # the solver's (or the command line's), or a smaller world's
            command = [sys.executable, "-m", "layerforge", "train", *argv_now]
            if world is not None:
                host_args = ["-f", _write_hostfile(live, os.path.join(scratch, f"hosts{attempt}"))] if live else []
                command = [*launcher, *host_args, "-n", str(world), *command]
            job = Job(command, dict(os.environ, **{RESTART_ENV: str(attempt)}))
            stop.job = job
            code = job.wait()
            code = 128 - code if code < 0 else code  # killed by signal S: exit 128 + S, as a shell reports it
            code = job.status(code)
            # exit status 2 is layerforge's for a user's error (cli.py, comm.guard), also where its line was lost
            if code in (0, USER_ERROR_STATUS) or stop.requested or job.user_error:
                return code
            cause = job.cause(code)
            if attempt == max_restarts:
                if max_restarts:
                    log.error("giving up after %d restart%s: %s", max_restarts, "s" * (max_restarts > 1), cause)
                return code
            if hosts:  # every host of the hostfile: one lost before may answer again
                placed = _placement(live, world)
                live, lost = _answering(launcher, hosts, scratch)
                lost = [name for name in lost if name in placed]  # newly lost: the job ran there
                if lost:
                    cause += "; " + "; ".join(f"host {name} lost (ranks {placed[name]}; it did not start a process "
                                              f"within {PROBE_SECONDS:g} s)" for name in lost)
                available = sum(slots for _, slots in live)
                fits = smaller_world(ranks, sp.iter_size, available, min_ranks) if live else None
                if fits is None:
                    log.error("not restarted: %s; %d rank%s left on the hosts that answer, --min-ranks %d", cause,
                              available, "s" * (available != 1), min_ranks)
                    return code
                world, iter_size = fits
            found = latest_snapshot(prefix, started)
            resume = found[0] if found else None
            where = (f"from {_shown(found[0])} (iteration {found[1]}"
                     + (f"; iteration {job.iteration} was reached" if job.iteration is not None else "") + ")"
                     if found else "from the start (no snapshot yet)")
            on = "in one process" if world is None else \
                f"on {world} rank{'s' * (world > 1)}" + (f", iter_size {iter_size}" if iter_size != sp.iter_size else "")
            log.warning("restart %d of %d: %s; resuming %s %s", attempt + 1, max_restarts, cause, where, on)
    return code


def _shown(path):
    """``path`` relative to the working directory when it lies below it, else absolute."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _find_mpiexec():
    from ..comm.testbed import find_mpiexec

    return find_mpiexec()


def _write_hostfile(hosts, path):
    with open(path, "w") as f:
        f.writelines(f"{name}:{slots}\n" for name, slots in hosts)
    return path


def _supervisors_here(attempt):
    """``{pid: rank}`` of the processes on this host that hydra started for attempt ``attempt`` (the ranks'
    supervisors: their parent does not carry the rank)."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if f"{RESTART_ENV}={attempt}".encode() in env and b"LAYERFORGE_SUPERVISED=1" not in env:
            rank = next((v[9:] for v in env if v.startswith(b"PMI_RANK=")), None)
            if rank is not None and rank.isdigit():
                found[int(entry)] = int(rank)
    return found


def _placement(hosts, ranks):
    """``{host: "a-b"}``: the ranks hydra places on each host of a hostfile (slots filled in order)."""
    placed, first = {}, 0
    while first < ranks:
        for name, slots in hosts:
            last = min(first + slots, ranks) - 1
            if last >= first:
                placed[name] = f"{placed[name]}," if name in placed else ""
                placed[name] += f"{first}" if last == first else f"{first}-{last}"
            first = last + 1
    return placed


def _answering(launcher, hosts, scratch):
    """``(hosts that run one process within PROBE_SECONDS, names of those that do not)``."""
    def answers(k):
        name, _ = hosts[k]
        path = _write_hostfile([(name, 1)], os.path.join(scratch, f"probe{k}"))
        try:
            done = subprocess.run([*launcher, "-f", path, "-n", "1", "true"], stdin=subprocess.DEVNULL,
                                  capture_output=True, timeout=PROBE_SECONDS, start_new_session=True)
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0

    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        alive = list(pool.map(answers, range(len(hosts))))
    return [h for h, a in zip(hosts, alive) if a], [h[0] for h, a in zip(hosts, alive) if not a]


class _Requests:
    """This process's SIGINT / SIGTERM / SIGHUP go on to the running job (mpiexec passes SIGINT and SIGTERM to every
    rank); after SIGINT or SIGTERM the job is not restarted."""

    def __init__(self):
        self.job, self.requested = None, False

    def __call__(self, signum, frame):
        job = self.job
        if signum != signal.SIGHUP:
            self.requested = True
        elif job is not None and _is_mpiexec(job):  # hydra's mpiexec ends on SIGHUP, passing nothing on
            log.warning("SIGHUP not passed on: mpiexec would end the job without a snapshot; send SIGTERM to stop")
            return
        if job is not None and job.proc.poll() is None:
            job.proc.send_signal(signum)


def _is_mpiexec(job):
    return not (len(job.proc.args) > 1 and job.proc.args[0] == sys.executable)


@contextlib.contextmanager
def _signals_passed_on():
    requests = _Requests()
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    main = threading.current_thread() is threading.main_thread()
    old = {s: signal.signal(s, requests) for s in signals} if main else {}
    try:
        yield requests
    finally:
        for s, h in old.items():
            signal.signal(s, h)
