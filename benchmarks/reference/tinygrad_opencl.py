"""The reference implementation's hand-coded kernels on the workloads, run by tinygrad 0.9.1 (whose kernel.py is the
spec) on its OpenCL backend (GPU=1, PoCL), kernel times from OpenCL events (DEBUG=2). Run it inside its own venv
through benchmarks/reference/vs_reference.sh, which alternates it with ours_opencl.py."""
import pyopencl  # noqa: F401  # sets PoCL up for the ICD loader tinygrad opens
import os
import statistics
from tinygrad import Tensor
from tinygrad.helpers import GlobalCounters

REPS = int(os.environ.get("REPS", 15))

def rand(*shape): return Tensor.rand(*shape).realize()

n = 4096
a, b, c = rand(n, n), rand(n, n), rand(n, n)
m4a, m4b, m6a, m6b = rand(1024, 1024), rand(1024, 1024), rand(512, 512), rand(512, 512)
x, w = rand(1, 64, 56, 56), rand(64, 64, 3, 3)
WORKLOADS = [("W1", lambda: a + b, 3 * 4 * n * n, "GB/s"), ("W2", lambda: a.sum(1), 4 * n * n + 4 * n, "GB/s"),
             ("W4", lambda: m4a @ m4b, 2 * 1024 ** 3, "GF/s"),
             ("W5", lambda: x.conv2d(w, padding=1), 2 * 64 * 56 * 56 * 64 * 9, "GF/s"),
             ("W6", lambda: m6a @ m6b, 2 * 512 ** 3, "GF/s"), ("W7", lambda: (a * b + c).relu(), 4 * 4 * n * n, "GB/s")]
for name, fn, amount, unit in WORKLOADS:
  times = []
  for i in range(REPS + 1):   # the first realize compiles
    GlobalCounters.reset()
    fn().realize()
    if i: times.append(GlobalCounters.time_sum_s)
  print(f"ref  {name} {amount / statistics.median(times) / 1e9:7.1f} {unit} (best {amount / min(times) / 1e9:.1f})",
        flush=True)
