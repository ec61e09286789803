"""The peak resident memory of a process and its descendants, sampled from /proc while they run (Linux).

The benchmarks' memory column and AUTO's CPU-parallelism trial (cpu_parallel) read it: the replicas of REPLICAS map
the same shared-memory segments, so their shared pages count once, as one process's would; their private and
file-backed pages add up. On a system without /proc the peak stays 0 (unknown).
"""
import os
import threading


def process_tree(root, parents=None):
    """``root`` and its descendants (pids), from /proc. ``parents``: a dict ``{pid: parent pid}`` kept from one call
    to the next, so that each call reads only the processes that started since the last (a sampler's every look)."""
    parents = {} if parents is None else parents
    try:
        entries = {int(e) for e in os.listdir("/proc") if e.isdigit()}
    except OSError:  # no /proc: the process alone, whose memory then reads 0
        return [root]
    for pid in parents.keys() - entries:  # ended
        del parents[pid]
    for pid in entries - parents.keys():
        try:
            with open(f"/proc/{pid}/stat") as f:
                parents[pid] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    children = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo += children.get(pid, [])
    return pids


def resident(pid):
    """``(RssAnon + RssFile, RssShmem)`` of a process in bytes, from /proc/PID/status (counters: cheap to read)."""
    fields = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("RssAnon:", "RssFile:", "RssShmem:")):
                    key, value = line.split(":", 1)
                    fields[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return fields.get("RssAnon", 0) + fields.get("RssFile", 0), fields.get("RssShmem", 0)


class PeakMemory:
    """The peak, sampled every ``interval`` s, of the memory of a process and its descendants together: their
    private and file-backed resident pages summed, plus the largest shared-memory residency of any of them (the
    replicas and their parent map the same segments). Libraries each process maps count once per process, so
    this errs high for several processes. (Their PSS, from smaps_rollup, would split those too, but reading it
    walks the page tables: 0.6 s for a process of 13 GB here, and it holds up the process's own allocations.)"""

    def __init__(self, pid, interval=0.05):
        self.pid, self.interval, self.peak = pid, interval, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        parents = {}
        while not self.done.is_set():
            # the tree at every look (its new processes read only): a replica that lives a second between two looks
            # at the tree once a second went unseen (a trial's peak of 13 MB over its process's)
            pids = process_tree(self.pid, parents)
            own, shared = zip(*[resident(p) for p in pids]) if pids else ((0,), (0,))
            self.peak = max(self.peak, sum(own) + max(shared))
            self.done.wait(self.interval)

    def stop(self):
        self.done.set()
        self.thread.join()
        return self.peak
