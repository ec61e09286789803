"""The multi-host test bed: inter-host bytes cross the shaped links (interface counters), an allreduce takes at
least the time the link rate allows, ranks of one host keep shared memory, and tear-down always runs.

Needs root or CAP_NET_ADMIN; elsewhere every test here skips with the reason."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from layerforge.cli import main as cli_main
from layerforge.errors import LayerforgeError
from layerforge.comm.testbed import TestBed, down, link_delta, namespaces, unavailable_reason
from tests.comm.mpirun import ROOT

_REASON = unavailable_reason()
needs_netns = pytest.mark.skipif(_REASON is not None, reason=f"test bed unavailable: {_REASON}")
PREFIX = f"lftt{os.getpid()}"  # per test process, so a benchmark's bed (prefix lftb) is never touched
BENCH = [sys.executable, "-m", "layerforge.commands.bench_allreduce"]


@pytest.fixture
def prefix():
    yield PREFIX
    leftovers = namespaces(PREFIX)
    down(PREFIX)
    assert leftovers == [], f"namespaces left behind: {leftovers}"


def _bench(bed, algorithm, nbytes, ranks_per_host, env=None):
    """One untimed-warm-up-free allreduce of nbytes under the bed; (result row, link bytes delta)."""
    before = bed.link_bytes()
    done = bed.run(BENCH + ["--sizes", str(nbytes), "--algorithms", algorithm, "--iterations", "1", "--warmup", "0",
                            "--json"], ranks_per_host=ranks_per_host, env=dict(env or {}, PYTHONPATH=ROOT), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert doc["groups"] == bed.hosts and doc["group_size"] == ranks_per_host  # MPICH sees one node per namespace
    (row,) = doc["results"]
    assert row["correct"]
    return row, link_delta(before, bed.link_bytes())


@needs_netns
@pytest.mark.parametrize("hosts,ranks_per_host,algorithm", [(2, 1, "recursive"), (2, 2, "recursive"),
                                                              (2, 2, "topology"), (4, 1, "ring")])
def test_inter_host_bytes_cross_the_shaped_links(prefix, hosts, ranks_per_host, algorithm):
    nbytes = 8 << 20
    with TestBed(hosts, gbit=10, prefix=prefix) as bed:
        row, delta = _bench(bed, algorithm, nbytes, ranks_per_host)
    counted = row["inter_bytes"] * ranks_per_host  # per host: the algorithm's own count of inter-host sends
    assert counted >= nbytes / 2
    for host, d in delta.items():
        # frames carry TCP/IP headers and startup (PMI, UCX wire-up) traffic: a few percent plus < 1 MB
        assert counted <= d["sent"] <= 1.05 * counted + 1e6, (host, d, counted)
    if ranks_per_host > 1:  # intra-host pairs stay in shared memory: their bytes are not on any link
        assert row["intra_bytes"] > 0


@needs_netns
def test_without_the_transport_setting_ucx_bypasses_the_links(prefix):
    """The negative control: with UCX's default transports the namespaces talk through shared memory."""
    nbytes = 8 << 20
    with TestBed(2, gbit=10, prefix=prefix) as bed:
        row, delta = _bench(bed, "recursive", nbytes, 1, env={"UCX_TLS": "all"})
    assert row["inter_bytes"] == nbytes
    assert all(d["sent"] < nbytes / 10 for d in delta.values()), delta


@needs_netns
@pytest.mark.parametrize("gbit", [0.5, 1.0])
@pytest.mark.parametrize("hosts,algorithm", [(2, "mpi"), (2, "recursive"), (4, "recursive")])
def test_allreduce_takes_at_least_the_link_time(prefix, gbit, hosts, algorithm):
    nbytes = 8 << 20
    with TestBed(hosts, gbit=gbit, prefix=prefix) as bed:
        row, delta = _bench(bed, algorithm, nbytes, 1)
    # every host sends 2 n (p-1)/p bytes (reduce-scatter + allgather) through its own link
    link_s = 2 * nbytes * (hosts - 1) / hosts * 8 / (gbit * 1e9)
    # the token bucket lets one burst (1 ms worth, >= 64 KiB) pass at once
    assert row["latency_s"] >= 0.95 * link_s - 1e-3, (row["latency_s"], link_s)
    assert min(d["sent"] for d in delta.values()) >= 2 * nbytes * (hosts - 1) / hosts


@needs_netns
def test_hosts_have_their_own_names_and_addresses(prefix):
    with TestBed(3, gbit=1, prefix=prefix) as bed:
        done = bed.run(["sh", "-c", "echo $(hostname) $(ip -4 -o addr show dev tb0 | awk '{print $4}')"],
                       timeout=60)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split("\n")[:-1]) == [f"{prefix}-h{i} 10.253.17.{i + 1}/24" for i in range(3)]


@needs_netns
def test_latency_is_netem_or_a_one_line_error(prefix):
    """This kernel may lack netem: then asking for a delay fails in one line and leaves nothing behind."""
    try:
        with TestBed(1, gbit=1, latency_us=50, prefix=prefix) as bed:
            shown = subprocess.run(["tc", "-n", bed.host_names[0], "qdisc", "show", "dev", "tb0"],
                                   capture_output=True, text=True).stdout
            assert "netem" in shown and "delay 50us" in shown and "tbf" in shown, shown
    except LayerforgeError as e:
        assert "CONFIG_NET_SCH_NETEM" in str(e) and "\n" not in str(e)
    assert namespaces(prefix) == []


@needs_netns
def test_tear_down_runs_on_error(prefix):
    with pytest.raises(RuntimeError):
        with TestBed(2, prefix=prefix):
            assert len(namespaces(prefix)) == 4  # two hosts, the switch, the head
            raise RuntimeError("boom")
    assert namespaces(prefix) == []
    assert not os.path.exists(f"/tmp/{prefix}-testbed")


@needs_netns
def test_tear_down_runs_on_sigterm(prefix):
    code = (f"import time; from layerforge.comm.testbed import TestBed\n"
            f"with TestBed(2, prefix={prefix!r}):\n    print('up', flush=True); time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                             env=dict(os.environ, PYTHONPATH=ROOT))
    assert child.stdout.readline().strip() == "up"
    assert len(namespaces(prefix)) == 4
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == 128 + signal.SIGTERM
    assert namespaces(prefix) == []


@needs_netns
def test_cli_up_exec_down_and_leftovers(prefix, capsys):
    assert cli_main(["testbed", "up", "--hosts", "2", "--gbit", "1,10", "--prefix", prefix]) == 0
    assert len(namespaces(prefix)) == 4
    assert cli_main(["testbed", "status", "--prefix", prefix]) == 0
    assert "1,10 Gbit/s" in capsys.readouterr().out
    # a process left inside a host namespace (an interrupted rank) must not keep the bed alive
    stray = subprocess.Popen(["ip", "netns", "exec", f"{prefix}-h1", "sleep", "60"])
    time.sleep(0.3)
    assert cli_main(["testbed", "down", "--prefix", prefix]) == 0
    assert stray.wait(timeout=10) == -signal.SIGKILL
    assert namespaces(prefix) == []
    assert cli_main(["testbed", "exec", "--prefix", prefix, "--", "hostname"]) == 2
    assert "no test bed" in capsys.readouterr().err


def test_bad_rates_are_one_line_errors(capsys):
    assert cli_main(["testbed", "run", "--gbit", "fast", "--prefix", PREFIX, "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "--gbit" in err


def test_unprivileged_reason_names_the_capability():
    setpriv = shutil.which("setpriv")
    if setpriv is None or _REASON is not None:
        pytest.skip("needs setpriv and a privileged starting point to drop from")
    done = subprocess.run([setpriv, "--inh-caps=-net_admin,-sys_admin", "--bounding-set=-net_admin,-sys_admin",
                           sys.executable, "-c",
                           "from layerforge.comm.testbed import unavailable_reason; print(unavailable_reason())"],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT)
    assert "CAP_NET_ADMIN" in done.stdout, done.stdout + done.stderr



@needs_netns
def test_cli_run_builds_runs_reports_and_tears_down(prefix, capfd):
    assert cli_main(["testbed", "run", "--hosts", "2", "--ranks-per-host", "2", "--prefix", prefix, "--",
                     "hostname"]) == 0
    out, err = capfd.readouterr()
    assert sorted(out.split()) == [f"{prefix}-h0"] * 2 + [f"{prefix}-h1"] * 2
    assert f"{prefix}-h0: sent" in err and f"{prefix}-h1: sent" in err
    assert namespaces(prefix) == []
