#!/usr/bin/env bash
# Everything a lent NVIDIA GPU should check, in one go: the catalogue with the standard protocol and every tensor-core
# level through each driver binding that works here (pycuda, cuda-python: one table each; the random-opt fuzz through
# the first), the kernel benchmarks and a short search (through the device's automatic choice). Logs go to $OUT (the
# device tool's folder) or ./gpu_out. Each step has its own time limit, so one that hangs costs only its own share;
# the limits add up to under the device tool's 10 minutes a command.
#   bash scripts/gpu_run.sh [fuzz sequences per case, default 8] [search budget in s, default 20]
set -u
cd "$(dirname "$0")/.."
out=${OUT:-gpu_out}
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1
step() { local name=$1 limit=$2; shift 2; echo "== $name (limit ${limit}s): $*"; timeout "$limit" "$@" 2>&1 | tee "$out/$name.txt"; echo "== $name: exit ${PIPESTATUS[0]}"; }
step env 40 bash -c 'nvidia-smi -L; nvcc --version | tail -1; python3 - <<"EOF"
import numpy
print("numpy", numpy.__version__)
for name, mod in (("pycuda", "pycuda"), ("cuda-bindings", "cuda.bindings")):
  try: m = __import__(mod, fromlist=["_"]); print(name, getattr(m, "__version__", None) or m.VERSION_TEXT)
  except Exception as e: print(name, "unusable:", type(e).__name__, e)
from kernopt.runtime.cuda import CUDADevice, DRIVERS
for d in (None, *DRIVERS): print(f"driver={d}:", CUDADevice.availability(d))
EOF'
# the drivers that import and see the GPU, in the automatic choice's order
drivers=$(python3 -c 'from kernopt.runtime.cuda import CUDADevice, DRIVERS
print(" ".join(d for d in DRIVERS if CUDADevice.availability(d)[0]))' 2>/dev/null)
python3 -c 'from kernopt.runtime.cuda import CUDADevice, DRIVERS
for d in DRIVERS:
  ok, why = CUDADevice.availability(d)
  if not ok: print(f"== no gpu_check through {d}: {why}")' 2>&1
first=1
for d in $drivers; do
  if [ $first = 1 ]; then step "gpu_check_$d" 230 python3 scripts/gpu_check.py --driver "$d" --fuzz "${1:-8}"
  else step "gpu_check_$d" 120 python3 scripts/gpu_check.py --driver "$d"
  fi
  first=0
done
for d in $drivers; do echo "== gpu_check through $d: $(grep -h 'failure(s) in' "$out/gpu_check_$d.txt" || echo 'no summary (timed out?)')"; done
step bench_kernels 110 python3 benchmarks/bench_kernels.py --device CUDA --repeats 7
step bench_search 95 python3 benchmarks/bench_search.py --device CUDA --workloads W6,W4 --budget "${2:-20}"
