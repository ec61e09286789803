#!/usr/bin/env bash
# Allreduce benchmark under mpiexec -n 2, 4, 8: every algorithm next to MPI's own, 1 MB .. 100 MB.
# Usage: benchmarks/bench_allreduce.sh [outdir]   (JSON per p in outdir, tables on stdout)
# Env: PS="2 4 8", GROUP_SIZE=2 (pretend groups of 2 ranks on one host), ITER_SMALL=15, ITER_LARGE=5.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-$(mktemp -d)}; echo "# JSON results in $out"
mkdir -p "$out"
py=$(command -v python3 || command -v python)
mpiexec=$(dirname "$($py -c 'import sys; print(sys.executable)')")/mpiexec
[ -x "$mpiexec" ] || mpiexec=mpiexec
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export LAYERFORGE_COMM_CALIBRATION=${LAYERFORGE_COMM_CALIBRATION:-$out/calibration.json}
for p in ${PS:-2 4 8}; do
  # small sizes are noisy when ranks outnumber cores: more repetitions there
  for spec in "1M,10M:${ITER_SMALL:-15}" "100M:${ITER_LARGE:-5}"; do
    sizes=${spec%%:*}; iters=${spec##*:}
    "$mpiexec" -n "$p" "$py" -m layerforge.commands.bench_allreduce --sizes "$sizes" \
      --iterations "$iters" --group-size "${GROUP_SIZE:-2}" --algorithms recursive,topology,ring,doubling,mpi,auto \
      --json > "$out/p${p}_${sizes//,/_}.json"
    "$py" - "$out/p${p}_${sizes//,/_}.json" <<'PY'
import json, sys
from layerforge.commands.bench_allreduce import _print_table
_print_table(json.load(open(sys.argv[1])))
PY
  done
done
