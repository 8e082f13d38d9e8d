#!/usr/bin/env bash
# Everything a lent NVIDIA GPU should check, in one go: the catalogue with the standard protocol and every tensor-core
# level, a random-opt fuzz, the kernel benchmarks and a short search. Logs go to $OUT (the device tool's folder) or
# ./gpu_out. Each step has its own time limit, so one that hangs costs only its own share.
#   bash scripts/gpu_run.sh [fuzz sequences per case, default 8] [search budget in s, default 20]
set -u
cd "$(dirname "$0")/.."
out=${OUT:-gpu_out}
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1
step() { local name=$1 limit=$2; shift 2; echo "== $name (limit ${limit}s): $*"; timeout "$limit" "$@" 2>&1 | tee "$out/$name.txt"; echo "== $name: exit ${PIPESTATUS[0]}"; }
step env 60 bash -c 'nvidia-smi -L; python3 -c "import numpy, cuda.bindings as cb; print(\"numpy\", numpy.__version__, \"cuda-bindings\", cb.__version__)"; nvcc --version | tail -1'
step gpu_check 240 python3 scripts/gpu_check.py --fuzz "${1:-8}"
step bench_kernels 120 python3 benchmarks/bench_kernels.py --device CUDA --repeats 7
step bench_search 100 python3 benchmarks/bench_search.py --device CUDA --workloads W6,W4 --budget "${2:-20}"
