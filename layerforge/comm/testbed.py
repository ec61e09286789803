"""A multi-host test bed on one machine: H network namespaces as hosts on a shaped switch, MPI across them.

Layout (every piece lives in namespaces the test bed creates, named ``<prefix>-...``; the machine's own
network namespace is never touched, so nothing leaks into its real network and tear-down is deleting them)::

    <prefix>-h0 .. <prefix>-h{H-1}   one per host: interface tb0 with 10.253.17.{i+1}/24, own hostname (UTS)
    <prefix>-head                    runs mpiexec (hydra's control traffic): tb0 with 10.253.17.254, unshaped
    <prefix>-sw                      the switch: bridge br0 with one port p{i} per host, "ph" for the head

Each host's link is shaped in both directions with ``tc``: tbf at the host's rate on its tb0 (what it sends)
and on its switch port p{i} (what it receives), plus netem delay where a latency is asked for, so a host
that talks to several others shares one NIC's bandwidth, as on a real cluster.

MPI: ``mpiexec -launcher ssh -launcher-exec <bed>/launch`` inside the head namespace; hydra calls the
launcher as it would call ssh (``launch -x HOST COMMAND``) and the launcher runs the proxy inside HOST's
namespace with its hostname set, so MPICH sees H nodes. With the PyPI mpich (ch4:ucx) UCX would reach the
other namespaces through shared memory (one kernel, one /dev/shm); ``UCX_TLS=tcp,self`` and
``UCX_NET_DEVICES=tb0`` make inter-host pairs use TCP over the shaped links, while ranks of one host still
use MPICH's own shared memory (``UCX_RNDV_THRESH=inf``: see :data:`TRANSPORT_ENV`). Byte counters of the
switch ports show what crossed each link.

Needs root or CAP_NET_ADMIN (``ip netns add``); :func:`unavailable_reason` says why not where it fails.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from ..errors import LayerforgeError

SUBNET = "10.253.17"  # /24 private addresses; routed nowhere outside the test bed's namespaces
HEAD_OCTET = 254
IFACE = "tb0"
DEFAULT_PREFIX = "lftb"
# UCX over TCP, on the test bed's interface only. Eager sends at every size: UCX's rendezvous protocol over
# TCP serialised the two directions of a Sendrecv between some host pairs here (25 MB took 2x or 3x the link
# time, with no drops or retransmissions), which made the schedule's speed depend on which hosts paired up.
TRANSPORT_ENV = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": IFACE, "UCX_RNDV_THRESH": "inf"}

# hydra's ssh launcher calls: <launcher> [ssh options] HOST COMMAND...; the host name is its namespace's name
_LAUNCHER = """#!/bin/sh
# written by layerforge.comm.testbed: what hydra calls instead of ssh
while [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
if [ -e "$(dirname "$0")/crashed-$host" ]; then echo "ssh: connect to host $host: No route to host" >&2; exit 255; fi
exec ip netns exec "$host" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
"""


def _ip(*args, check=True, tool="ip"):
    """Run ``ip ARGS`` (``tool="tc"``: tc); a failure becomes one LayerforgeError line."""
    cmd = [tool, *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise LayerforgeError(f"test bed: `{' '.join(cmd)}` failed: {done.stderr.strip() or done.returncode}")
    return done


def unavailable_reason():
    """None where network namespaces can be made here, else why not (one line, for skips and errors)."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "the test bed needs iproute2's `ip` and `tc` on PATH"
    probe = f"{DEFAULT_PREFIX}-probe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace (needs root or CAP_NET_ADMIN): {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def find_mpiexec():
    """The mpiexec next to this interpreter (the mpich wheel's hydra), else the one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = here if os.access(here, os.X_OK) else shutil.which("mpiexec")
    if found is None:
        raise LayerforgeError("test bed: no mpiexec next to the interpreter or on PATH (pip install mpich)")
    return found


def namespaces(prefix=DEFAULT_PREFIX):
    """Names of the existing network namespaces that belong to the test bed ``prefix``."""
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    return [line.split()[0] for line in listed if line.startswith(prefix + "-")]


def down(prefix=DEFAULT_PREFIX):
    """Remove every namespace (with its links and qdiscs) and state directory of test bed ``prefix``.

    Processes still inside a host namespace (a rank of an interrupted run) are killed first: a namespace
    lives on while a process holds it. Safe to call when nothing is there; returns the namespaces removed.
    """
    removed = namespaces(prefix)
    for ns in removed:
        for pid in _ip("netns", "pids", ns, check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        _ip("netns", "del", ns, check=False)
    shutil.rmtree(state_dir(prefix), ignore_errors=True)
    return removed


def state_dir(prefix=DEFAULT_PREFIX):
    return os.path.join("/tmp", f"{prefix}-testbed")


class TestBed:
    """H emulated hosts with shaped links. A context manager: up on enter, down on exit, SIGTERM and SIGHUP.

    Args:
        hosts: number of hosts H (1..200).
        gbit: link rate per host in Gbit/s, one number or one per host.
        latency_us: one-way delay added per link direction (netem); 0 adds none.
        prefix: name prefix of everything made (two beds with different prefixes coexist).
    """

    __test__ = False  # not a pytest class despite the name

    def __init__(self, hosts, gbit=1.0, latency_us=0.0, prefix=DEFAULT_PREFIX):
        if not 1 <= int(hosts) <= 200:
            raise LayerforgeError(f"test bed: hosts must be 1..200, got {hosts}")
        rates = list(gbit) if isinstance(gbit, (list, tuple)) else [gbit] * int(hosts)
        if len(rates) != int(hosts) or any(float(r) <= 0 for r in rates):
            raise LayerforgeError(f"test bed: need one positive rate per host ({hosts}), got {gbit}")
        if latency_us < 0:
            raise LayerforgeError(f"test bed: latency must be >= 0 us, got {latency_us}")
        self.hosts, self.gbit, self.latency_us, self.prefix = int(hosts), [float(r) for r in rates], latency_us, prefix
        self.host_names = [f"{prefix}-h{i}" for i in range(self.hosts)]
        self.switch, self.head = f"{prefix}-sw", f"{prefix}-head"
        self.dir = state_dir(prefix)
        self.launcher = os.path.join(self.dir, "launch")
        self._old_handlers = {}

    @classmethod
    def existing(cls, prefix=DEFAULT_PREFIX):
        """The bed ``up`` left running under ``prefix`` (read from its state file)."""
        path = os.path.join(state_dir(prefix), "state.json")
        try:
            with open(path) as f:
                state = json.load(f)
        except (OSError, ValueError):
            raise LayerforgeError(f"{path}: no test bed '{prefix}' is up; run `layerforge testbed up` first") from None
        return cls(state["hosts"], state["gbit"], state["latency_us"], prefix)

    def address(self, i):
        return f"{SUBNET}.{i + 1}"

    # -- lifetime ----------------------------------------------------------------------------------------------
    def up(self):
        """Create the namespaces, links and shaping (after removing leftovers of the same prefix)."""
        down(self.prefix)
        os.makedirs(self.dir)
        try:
            self._build()
        except BaseException:
            down(self.prefix)
            raise
        with open(self.launcher, "w") as f:
            f.write(_LAUNCHER)
        os.chmod(self.launcher, 0o755)
        with open(os.path.join(self.dir, "state.json"), "w") as f:
            json.dump({"hosts": self.hosts, "gbit": self.gbit, "latency_us": self.latency_us}, f)
        return self

    def _build(self):
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "set", "lo", "up")
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        ends = [(ns, f"p{i}", self.address(i)) for i, ns in enumerate(self.host_names)]
        for ns, port, addr in ends + [(self.head, "ph", f"{SUBNET}.{HEAD_OCTET}")]:
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            # both ends are created directly in their namespaces: the root namespace never sees them
            _ip("link", "add", IFACE, "netns", ns, "type", "veth", "peer", "name", port, "netns", self.switch)
            _ip("-n", self.switch, "link", "set", port, "master", "br0")
            _ip("-n", self.switch, "link", "set", port, "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", IFACE)
            _ip("-n", ns, "link", "set", IFACE, "up")
        for (ns, port, _), rate in zip(ends, self.gbit):
            self._shape(ns, IFACE, rate)
            self._shape(self.switch, port, rate)

    def _shape(self, ns, dev, gbit):
        rate_bytes = gbit * 1e9 / 8
        # a token bucket of 1 ms worth of bytes (>= 64 KiB, one GSO segment) keeps the rate exact over ms;
        # the 50 ms queue lets TCP fill the link without drops
        tbf = ["tbf", "rate", f"{gbit * 1000:.0f}mbit", "burst", str(max(65536, int(rate_bytes * 1e-3))),
               "latency", "50ms"]
        if self.latency_us > 0:
            done = _ip("-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay",
                       f"{self.latency_us}us", "limit", "100000", check=False, tool="tc")
            if done.returncode != 0:
                raise LayerforgeError(f"test bed: cannot add latency with netem on this kernel ({done.stderr.strip()});"
                                      " it needs CONFIG_NET_SCH_NETEM: use --latency-us 0")
            _ip("-n", ns, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf, tool="tc")
        else:
            _ip("-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", *tbf, tool="tc")

    def down(self):
        return down(self.prefix)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
            for sig in (signal.SIGTERM, signal.SIGHUP):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            return self.up()
        except BaseException:
            self._restore_handlers()
            raise

    def __exit__(self, *exc):
        self._restore_handlers()
        self.down()
        return False

    def _on_signal(self, signum, frame):
        raise SystemExit(128 + signum)  # unwinds through __exit__, so tear-down runs

    def _restore_handlers(self):
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers = {}

    # -- MPI -------------------------------------------------------------------------------------------------
    def hostfile(self, ranks_per_host=1, hosts=None):
        """Write and return a hydra hostfile: ``<prefix>-h<i>:<ranks_per_host>`` for the first ``hosts``."""
        hosts = self.hosts if hosts is None else hosts
        path = os.path.join(self.dir, f"hosts_{hosts}x{ranks_per_host}")
        with open(path, "w") as f:
            f.writelines(f"{name}:{ranks_per_host}\n" for name in self.host_names[:hosts])
        return path

    def mpiexec_prefix(self):
        """mpiexec, run in the head namespace with the bed's launcher, up to (not including) its ``-f`` and ``-n``:
        what ``layerforge train --mpiexec`` takes to start ranks on the bed's hosts."""
        return ["ip", "netns", "exec", self.head, find_mpiexec(), "-launcher", "ssh", "-launcher-exec", self.launcher,
                "-localhost", f"{SUBNET}.{HEAD_OCTET}"]

    def mpiexec_command(self, argv, ranks_per_host=1, hosts=None):
        """The command line that runs ``argv`` as hosts x ranks_per_host ranks across the bed (block order:
        ranks 0..k-1 on host 0, so ``rank // ranks_per_host`` is the host)."""
        hosts = self.hosts if hosts is None else hosts
        if not 1 <= hosts <= self.hosts or ranks_per_host < 1:
            raise LayerforgeError(f"test bed: cannot place {hosts} hosts x {ranks_per_host} ranks on a bed of "
                                  f"{self.hosts} hosts")
        return [*self.mpiexec_prefix(), "-f", self.hostfile(ranks_per_host, hosts),
                "-n", str(hosts * ranks_per_host), *argv]

    def crash_host(self, i, dark_after=0.5):
        """Host ``i`` fails: every process in it dies at once (SIGKILL), and ``dark_after`` seconds later its link
        goes dark, so that nothing reaches it any more (a launcher that tries to start a process there waits in
        vain). In between, the kernel closes the dead processes' connections, so their peers see them end, as they
        do when a node's processes crash or its OS goes down; a node that loses power says nothing, and its peers
        wait for TCP's timeouts. From then on the bed's launcher refuses the host, as ssh to a dead machine fails.
        Returns how many processes were killed."""
        ns = self.host_names[i]
        open(os.path.join(self.dir, f"crashed-{ns}"), "w").close()  # the launcher (our ssh) no longer reaches it
        pids = [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split()]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(dark_after)
        _ip("-n", self.switch, "link", "set", f"p{i}", "down")
        _ip("-n", ns, "link", "set", IFACE, "down")
        return len(pids)

    def environment(self, extra=None):
        """The caller's environment plus the transport settings that send inter-host traffic over the links."""
        return {**os.environ, **TRANSPORT_ENV, **(extra or {})}

    def run(self, argv, ranks_per_host=1, hosts=None, env=None, timeout=None, capture=True):
        """Run ``argv`` under mpiexec across the bed; returns the CompletedProcess."""
        return subprocess.run(self.mpiexec_command(argv, ranks_per_host, hosts), env=self.environment(env),
                              capture_output=capture, text=True, timeout=timeout)

    # -- counters -------------------------------------------------------------------------------------------
    def link_bytes(self):
        """``{host name: {"sent": bytes, "received": bytes}}`` on each host's link, from the switch ports
        (what a port receives is what its host sent), frames including headers."""
        listed = json.loads(_ip("-n", self.switch, "-s", "-j", "link", "show").stdout)
        ports = {d["ifname"]: d["stats64"] for d in listed}
        return {name: {"sent": ports[f"p{i}"]["rx"]["bytes"], "received": ports[f"p{i}"]["tx"]["bytes"]}
                for i, name in enumerate(self.host_names)}

    def describe(self):
        latency = f", {self.latency_us:g} us each way per link" if self.latency_us else ""
        rates = ",".join(f"{r:g}" for r in self.gbit) if len(set(self.gbit)) > 1 else f"{self.gbit[0]:g}"
        return f"{self.hosts} hosts ({self.prefix}-h*), {rates} Gbit/s per host link{latency}"


def link_delta(before, after):
    """Bytes per host link between two :meth:`TestBed.link_bytes` readings."""
    return {h: {k: after[h][k] - before[h][k] for k in after[h]} for h in after}
