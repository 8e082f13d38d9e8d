"""Codegen latency: Kernel(ast) + the standard protocol for every catalogue AST (large scale), cold (a freshly built
AST each repeat) and warm (the same AST object again), then linearize + render when the lowerer is present.
Prints the median over repeats in milliseconds. Usage: python3 benchmarks/bench_codegen.py [repeats] [dialect...];
`python3 benchmarks/bench_codegen.py workloads [repeats]` times benchmarks/workloads.py's ASTs phase by phase."""
from __future__ import annotations
import os
import statistics
import sys
import time
from typing import Any, Callable

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), p) for p in ("..", "../tests")]
from kernopt.kernel import Kernel  # noqa: E402
from kernopt.renderers import get_renderer  # noqa: E402

def optimize(ast: Any, dialect: str) -> Kernel:
  k = Kernel(ast, opts=get_renderer(dialect)).required_optimizations()
  if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  return k

def median_ms(fn: Callable[[], Any], setup: Callable[[], Any], repeats: int) -> float:
  times = []
  for _ in range(repeats):
    arg = setup()
    t0 = time.perf_counter()
    fn(arg)
    times.append(time.perf_counter() - t0)
  return 1e3 * statistics.median(times)

def cases() -> tuple[list[str], Callable[[str], Any]]:
  """Case names and a builder giving a fresh AST object for a name."""
  try:
    import catalogue
  except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../tests"))
    import test_kernel as tk
    own = {"add": tk.ew_add, "bcast_add": tk.bcast_add, "sum_all": tk.sum_all, "matvec": tk.matvec,
           "matmul_1024": lambda: tk.matmul(1024, 1024, 1024), "sym_add": tk.sym_add}
    return list(own), lambda n: own[n]()
  def fresh(name: str) -> Any:
    catalogue._build.cache_clear()
    return catalogue.get(name, "large").ast
  return [c.name for c in catalogue.catalogue("large")], fresh

def workload_phases(repeats: int) -> None:
  """benchmarks/workloads.py's ASTs on the static C profile and the CPU device's renderer: the median over cold
  repeats of the whole Kernel + protocol + to_program, and of each phase (opts, lower, rewrite, order, the renderer's
  passes, render)."""
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from workloads import workloads
  from kernopt.lowerer import lower
  from kernopt.passes import passes_for, run_passes
  from kernopt.renderers.cstyle import CRenderer
  from kernopt.runtime import Device
  from kernopt.uopgraph import graph_rewrite, order_uops, simplifier
  print(f"load average {os.getloadavg()}")
  print(f"{'profile':8s} {'workload':9s} {'total':>7s} {'opts':>6s} {'lower':>6s} {'rewrite':>7s} {'order':>6s} "
        f"{'passes':>6s} {'render':>7s}  uops  (ms, median of {repeats} cold runs)")
  for pname, r in (("C", CRenderer()), ("native", Device["CPU"].renderer)):
    for wname, w in workloads().items():
      totals, phases = [], []
      for _ in range(repeats):
        ast = w.build()
        t0 = time.perf_counter()
        prg = optimize_with(ast, r).to_program()
        totals.append(time.perf_counter() - t0)
        ts = [time.perf_counter()]
        k = optimize_with(w.build(), r)
        ast2 = k.get_optimized_ast()
        ts.append(time.perf_counter())
        sink = lower(ast2, r)
        ts.append(time.perf_counter())
        g = graph_rewrite(sink, simplifier)
        ts.append(time.perf_counter())
        uops = order_uops(g)
        ts.append(time.perf_counter())
        uops = run_passes(uops, passes_for(r))
        ts.append(time.perf_counter())
        r.render("k", uops)
        ts.append(time.perf_counter())
        phases.append([b - a for a, b in zip(ts, ts[1:])])
      med = [statistics.median(p[i] for p in phases) for i in range(6)]
      print(f"{pname:8s} {wname:9s} {1e3 * statistics.median(totals):7.2f} " +
            " ".join(f"{1e3 * m:{wd}.2f}" for m, wd in zip(med, (6, 6, 7, 6, 6, 7))) + f"  {len(prg.uops)}  {w.desc}")
  print(f"load average {os.getloadavg()}")

def optimize_with(ast: Any, renderer: Any) -> Kernel:
  k = Kernel(ast, opts=renderer).required_optimizations()
  if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  return k

def core_lines() -> None:
  """The size of the core (everything above runtime/, as DESIGN.md's table draws it): lines per module and in all."""
  root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernopt")
  counts = {}
  for dirpath, _, files in os.walk(root):
    if os.path.basename(dirpath) in ("runtime", "__pycache__"): continue
    for f in files:
      if f.endswith(".py") and f not in ("search.py", "search_space.py", "validation.py", "search_config.py",
                                         "search_workers.py", "tuning_file.py"):
        path = os.path.join(dirpath, f)
        with open(path) as fh: counts[os.path.relpath(path, root)] = sum(1 for line in fh if line.strip())
  print("core lines (non-blank): " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda x: -x[1])))
  print(f"core total: {sum(counts.values())} non-blank lines in {len(counts)} modules")

def main() -> None:
  core_lines()
  if len(sys.argv) > 1 and sys.argv[1] == "workloads":
    workload_phases(int(sys.argv[2]) if len(sys.argv) > 2 else 7)
    return
  repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 7
  dialects = sys.argv[2:] or ["CPU", "OPENCL", "CUDA"]
  names, fresh = cases()
  print(f"{'case':16s} {'dialect':7s} {'cold ms':>8s} {'warm ms':>8s} {'lin+render ms':>14s}  kernel")
  cold_all, warm_all = [], []
  for name in names:
    for d in dialects:
      cold = median_ms(lambda ast: optimize(ast, d), lambda: fresh(name), repeats)
      ast = fresh(name)
      warm = median_ms(lambda ast: optimize(ast, d), lambda: ast, repeats)
      cold_all.append(cold)
      warm_all.append(warm)
      k = optimize(ast, d)
      try:
        lin = f"{median_ms(lambda k: k.copy().to_program(), lambda: k, repeats):14.2f}"
      except Exception as e:  # the lowerer or this dialect's renderer may not handle it yet
        lin = f"{type(e).__name__:>14s}"
      print(f"{name:16s} {d:7s} {cold:8.2f} {warm:8.2f} {lin}  {k!r}")
  print(f"median over all: cold {statistics.median(cold_all):.2f} ms, warm {statistics.median(warm_all):.2f} ms")

if __name__ == "__main__":
  main()
