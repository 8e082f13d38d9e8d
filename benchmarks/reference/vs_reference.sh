#!/usr/bin/env bash
# Our hand-coded OpenCL kernels against the reference implementation's on the same PoCL, alternated ROUNDS times
# (default 3) so both see the same machine phase: tinygrad 0.9.1 in its own venv ($REF_VENV, made on first use).
# Both load pyopencl's ICD loader, which reads /etc/OpenCL/vendors first: pin one device with CL_DEVICE (ours).
#   bash benchmarks/reference/vs_reference.sh [ROUNDS]
set -eu
cd "$(dirname "$0")/../.."
venv=${REF_VENV:-/tmp/kernopt-reference-venv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q tinygrad==0.9.1 numpy
fi
# the same OpenCL route as CI (Debian's PoCL where apt-get exists, the pip PoCL, else Intel's runtime): a working device
PYTHON="$venv/bin/python" bash .ci/install_opencl.sh
libs=$("$venv/bin/python" -c "import os, pyopencl; print(os.path.dirname(pyopencl.__file__))")/.libs
mkdir -p "$venv/opencl"
ln -sf "$(ls "$libs"/libOpenCL*.so* | head -1)" "$venv/opencl/libOpenCL.so"   # tinygrad looks for libOpenCL.so
for i in $(seq "${1:-3}"); do
  echo "round $i, $(date -u +%H:%M:%S) UTC"
  LD_LIBRARY_PATH="$venv/opencl:$libs" GPU=1 DEBUG=2 "$venv/bin/python" benchmarks/reference/tinygrad_opencl.py \
    2>&1 | grep '^ref'
  python3 benchmarks/reference/ours_opencl.py
done
