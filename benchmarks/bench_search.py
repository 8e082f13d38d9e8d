"""Beam search against the hand-coded heuristics on the CPU device (one thread): for each workload
(benchmarks/workloads.py) the hand-coded and the searched kernel's GFLOP/s (compute-bound) or GB/s (memory-bound),
both timed again here interleaved (median of repeats), the search's wall time, and the candidates it compiled and timed.
Each search has its own time budget and a fresh compile cache, and its result is checked against numpy.
Usage: python3 benchmarks/bench_search.py [--workloads W2,W6] [--workers 2] [--repeats 15] [--scale 1.0]
  [--device CPU|OPENCL] [--budget SECONDS]
  python3 benchmarks/bench_search.py --import-only [--import-entries 200000]: only the tuning cache's export and
  import of that many synthetic entries (seconds; quick)."""
from __future__ import annotations
import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), p) for p in ("..", "../tests")]
import numpy as np  # noqa: E402
from workloads import Workload, workloads  # noqa: E402
from kernopt import search  # noqa: E402
from kernopt.dtype import dtypes  # noqa: E402
from kernopt.helpers import config_override  # noqa: E402
from kernopt.kernel import Kernel  # noqa: E402
from kernopt.runtime import Buffer, Device  # noqa: E402

BUDGETS = {"W2": 5.0, "W6": 5.0, "W4": 20.0, "W5": 20.0, "W1": 5.0, "W7": 5.0}   # seconds of search per workload

def figure(w: Workload, seconds: float) -> str:
  return f"{w.flops / seconds / 1e9:8.2f} GFLOP/s" if w.bound == "compute" else f"{w.bytes / seconds / 1e9:8.2f} GB/s"

def run_workload(w: Workload, dev, workers: int, repeats: int, budget: float) -> dict:
  inputs = w.inputs(np.random.default_rng(0))
  bufs = [Buffer(dev.name, n, dtypes.float32).copyin(inputs[i] if i in inputs else np.zeros(n, np.float32))
          for i, n in w.buffers]
  start = Kernel(w.build(), opts=dev.renderer)
  hand = start.copy()
  if not hand.apply_tensor_cores(): hand.hand_coded_optimizations()
  t0 = time.perf_counter()
  res = search.search(start, bufs, search.SearchConfig(time_budget_s=budget, workers=workers, progress=True))
  wall = time.perf_counter() - t0
  runners = [dev.compile(hand.to_program()), dev.compile(res.kernel.to_program())]
  times: list[list[float]] = [[], []]
  for _ in range(repeats):  # interleaved
    for i, r in enumerate(runners): times[i].append(r(*bufs, wait=True))
  np.testing.assert_allclose(bufs[0].numpy(), w.reference(inputs), rtol=w.tol, atol=w.tol * 10)
  t_hand, t_found = (statistics.median(t) for t in times)
  return {"w": w, "hand": t_hand, "found": t_found, "wall": wall, "res": res}

def bench_import(n: int) -> None:
  """Seconds to import (one transaction) and export n synthetic tuning entries into a fresh cache."""
  import hashlib
  import json
  entry = {"opts": [["UPCAST", 0, 4], ["LOCAL", 1, 16]], "validated": True, "time_s": 1e-5, "baseline_s": 2e-5,
           "searched_at": 0.0, "complete": True, "budget_s": None, "imported": False, "device": "CPU",
           "kernel": "r_64_16_4", "compiled": 40, "timed": 30}
  entries = {"tune-" + hashlib.sha256(str(i).encode()).hexdigest(): {**entry, "time_s": i * 1e-9} for i in range(n)}
  with tempfile.TemporaryDirectory(prefix="kernopt-bench-import-") as d, config_override(CACHE_DIR=d):
    path = os.path.join(d, "tuning.json")
    with open(path, "w") as f: json.dump({"format": search.EXPORT_FORMAT, "version": search.EXPORT_VERSION,
                                          "entries": entries}, f)
    t0 = time.perf_counter()
    taken = search.import_cache(path)
    t1 = time.perf_counter()
    exported = search.export_cache(os.path.join(d, "again.json"))
    t2 = time.perf_counter()
  print(f"tuning cache: import of {taken} entries {t1 - t0:.2f} s, export of {exported} entries {t2 - t1:.2f} s")

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--import-only", action="store_true", help="only time the tuning cache's import and export")
  ap.add_argument("--import-entries", type=int, default=200_000, help="entries for the import benchmark")
  ap.add_argument("--workloads", default="W2,W6,W4,W5")
  ap.add_argument("--workers", type=int, default=2)
  ap.add_argument("--repeats", type=int, default=15)
  ap.add_argument("--scale", type=float, default=1.0, help="multiply every time budget")
  ap.add_argument("--device", default="CPU", help="CPU (one thread) or OPENCL")
  ap.add_argument("--budget", type=float, default=None, help="one time budget (s) for every workload")
  args = ap.parse_args()
  if args.import_only: return bench_import(args.import_entries)
  dev = Device.open("CPU", threads=1) if args.device.upper() == "CPU" else Device.open(args.device)
  if args.budget is not None: BUDGETS.update({k: args.budget for k in BUDGETS})
  src, dst = np.ones(16 << 20, np.float32), np.empty(16 << 20, np.float32)
  copies = []
  for _ in range(7):
    st = time.perf_counter()
    np.copyto(dst, src)
    copies.append(time.perf_counter() - st)
  ws = workloads()
  rows = []
  with tempfile.TemporaryDirectory(prefix="kernopt-bench-search-") as cache, config_override(CACHE_DIR=cache):
    for name in args.workloads.split(","):
      w = ws[name]
      rows.append(run_workload(w, dev, args.workers, args.repeats, BUDGETS.get(name, 10.0) * args.scale))
  where = f"CPU, one thread, {dev.compiler_id().split(' | ')[1]}" if dev.name == "CPU" else dev.compiler_id()
  print(f"\n{where}; medians of {args.repeats} interleaved runs; copy bandwidth (np.copyto 64 MiB, read+write) "
        f"{2 * src.nbytes / statistics.median(copies) * 1e-9:.1f} GB/s")
  print(f"{'':3} {'workload':34} {'hand-coded':>16} {'searched':>16} {'speedup':>7} {'budget':>6} {'wall':>6} "
        f"{'compiled':>8} {'timed':>5}  searched opts")
  for r in rows:
    w, res = r["w"], r["res"]
    opts = [(o.op.name, o.axis, o.amt) for o in res.kernel.applied_opts]
    print(f"{w.name:3} {w.desc:34} {figure(w, r['hand']):>16} {figure(w, r['found']):>16} "
          f"{r['hand'] / r['found']:6.2f}x {BUDGETS.get(w.name, 10.0) * args.scale:5.0f}s {r['wall']:5.1f}s "
          f"{res.stats.compiled:8d} {res.stats.timed:5d}  {opts}")
  bench_import(args.import_entries)

if __name__ == "__main__":
  main()
