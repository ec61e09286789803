"""``layerforge testbed``: emulated hosts on one machine (network namespaces, shaped links), MPI across them.

    layerforge testbed run --hosts 2 --ranks-per-host 2 --gbit 1 -- layerforge bench_allreduce --sizes 100M
    layerforge testbed up --hosts 4 --gbit 10        # leaves it up; then `exec`, `status`, finally `down`
    layerforge testbed exec --ranks-per-host 1 -- python my_mpi_program.py
    layerforge testbed status                        # namespaces and bytes per host link so far
    layerforge testbed down                          # removes everything named <prefix>-*, leftovers too

``run`` builds the bed, runs the command under mpiexec across it, prints the bytes that crossed each host's
link and tears the bed down, also on Ctrl-C or SIGTERM. Needs root or CAP_NET_ADMIN. See
layerforge/comm/testbed.py for the layout and docs/distributed.md ("Multi-host test bed").
"""
import argparse
import sys

from ..errors import LayerforgeError

HELP = "emulate H hosts on this machine (network namespaces, tc-shaped links) and run an MPI command across them"


def _rates(text):
    try:
        rates = [float(r) for r in text.split(",")]
    except ValueError:
        raise LayerforgeError(f"--gbit {text!r}: give a rate in Gbit/s, or one per host separated by commas") from None
    return rates[0] if len(rates) == 1 else rates


def add_arguments(parser):
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--prefix", default="lftb", help="name prefix of the namespaces and state directory")
    shape = argparse.ArgumentParser(add_help=False)
    shape.add_argument("--hosts", type=int, default=2, help="emulated hosts")
    shape.add_argument("--gbit", default="1", help="link rate per host in Gbit/s, or one per host: 1,1,10,10")
    shape.add_argument("--latency-us", type=float, default=0.0, help="added one-way delay per link direction "
                       "(netem; the kernel must have it)")
    launch = argparse.ArgumentParser(add_help=False)
    launch.add_argument("--ranks-per-host", type=int, default=1, help="MPI ranks on each host")
    launch.add_argument("program", nargs="*", help="after --: the program to run under mpiexec")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    for name, parents, text in (("run", (common, shape, launch), "build, run the command across it, tear down"),
                                ("up", (common, shape), "build and leave it up"),
                                ("exec", (common, launch), "run the command across the bed that is up"),
                                ("status", (common,), "namespaces and bytes per host link"),
                                ("down", (common,), "remove everything named PREFIX-*, leftovers included")):
        actions.add_parser(name, parents=parents, help=text, description=text, formatter_class=parser.formatter_class)


def _print_links(bed, before, after):
    from ..comm.testbed import link_delta

    print(f"# {bed.describe()}: bytes on each host's link (frames, from the switch ports)", file=sys.stderr)
    for host, d in link_delta(before, after).items():
        print(f"#   {host}: sent {d['sent'] / 1e6:10.3f} MB  received {d['received'] / 1e6:10.3f} MB", file=sys.stderr)


def _exec(bed, args):
    if not args.program:
        raise LayerforgeError(f"testbed {args.action}: give the program after --, e.g. -- layerforge bench_allreduce")
    before = bed.link_bytes()
    done = bed.run(args.program, ranks_per_host=args.ranks_per_host, capture=False)
    _print_links(bed, before, bed.link_bytes())
    return done.returncode


def run(args):
    from ..comm.testbed import TestBed, down, namespaces, unavailable_reason

    if args.action == "down":
        removed = down(args.prefix)
        print(f"removed {len(removed)} namespaces" + (f": {' '.join(removed)}" if removed else ""))
        return 0
    if args.action == "status":
        names = namespaces(args.prefix)
        if not names:
            print(f"no test bed '{args.prefix}' is up")
            return 0
        bed = TestBed.existing(args.prefix)
        print(bed.describe())
        for host, d in bed.link_bytes().items():
            print(f"  {host}: sent {d['sent']} B, received {d['received']} B since up")
        return 0
    if args.action == "exec":
        return _exec(TestBed.existing(args.prefix), args)
    rates = _rates(args.gbit)
    reason = unavailable_reason()
    if reason:
        raise LayerforgeError(f"testbed: {reason}")
    bed = TestBed(args.hosts, rates, args.latency_us, args.prefix)
    if args.action == "up":
        bed.up()
        print(f"up: {bed.describe()}; `layerforge testbed exec -- CMD` runs across it, `layerforge testbed down` "
              "removes it")
        return 0
    with bed:
        return _exec(bed, args)
