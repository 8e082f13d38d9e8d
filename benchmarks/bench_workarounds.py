"""What the compiler-miscompile flags (runtime/cpu.py MISCOMPILES) cost: each workload's kernel built with and
without them, 1 thread, in one process, alternated ROUNDS times (argv[1], default 15); the median time ratio
with / without (> 1: the workaround is slower)."""
import os
import statistics
import sys
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_kernels as bk
from kernopt.runtime import Device
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 15
for n, w in bk.workloads().items():
  inputs = w.inputs(np.random.default_rng(0))
  rs = {fix: bk.prepare(w, Device.open("CPU", threads=1, workarounds=fix), 1, inputs) for fix in (True, False)}
  t = {True: [], False: []}
  for _ in range(ROUNDS):
    for fix in (True, False): t[fix].append(rs[fix]["run"]())
  a, b = statistics.median(t[True]), statistics.median(t[False])
  print(f"{n} {rs[True]['name']:22s} with {1e3*a:8.2f} ms  without {1e3*b:8.2f} ms  with/without {a/b:.3f}", flush=True)
