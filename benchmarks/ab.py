"""A/B kernel benchmark: this tree against another git revision, alternated round by round on the same machine, so
both see the same load. Each round runs one fresh process per tree (the order swapped every round); a process times
every workload of benchmarks/workloads.py that both trees have: cold codegen (Kernel + standard protocol +
to_program, median over repeats) and the kernel (median over repeats after a warm-up launch, checked against numpy).
The figure per workload is the median over rounds of the within-round ratio base time / this tree's time (above 1:
this tree is faster). Codegen also gets each tree's least thread time over every repeat and round, and their ratio:
on a host whose speed changes for seconds at a time (a shared vCPU), medians move with it, the least CPU time of
each tree much less.
With --pairs N, each workload's cold codegen is also timed in one long-lived process per tree, the two alternated call
by call, N pairs: the median of the per-pair ratios, and that median over the quiet pairs only (both times within
QUIET of their tree's least), with their count.
Usage: python3 benchmarks/ab.py --base REV [--rounds 5] [--repeats 7] [--workloads W1,W4] [--threads 1,2]
                                [--profile native|static] [--asts benchmarks/asts/mlp_l1.json,...] [--pairs 200]"""
from __future__ import annotations
import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# run in each tree's own process: that tree's kernopt, workloads and catalogue, and only API both trees have
DRIVER = r'''
import json, os, statistics, sys, time
tree = sys.argv[1]
sys.path[:0] = [tree, os.path.join(tree, "benchmarks"), os.path.join(tree, "tests")]
import numpy as np
from workloads import workloads
from kernopt.dtype import dtypes
from kernopt.helpers import config_override
from kernopt.kernel import Kernel
from kernopt.runtime import Buffer, Device
names, repeats, threads, profile = sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
dev = Device.open("CPU", profile="static") if profile == "static" else Device.open("CPU", threads=threads)
def optimize(ast):
  k = Kernel(ast, opts=dev.renderer).required_optimizations()
  if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  return k
out, all_w = {}, workloads()
for name in names:
  if name not in all_w: continue
  w = all_w[name]
  cg, cg_cpu = [], []
  for _ in range(repeats):
    ast = w.build()
    t0, c0 = time.perf_counter(), time.thread_time()
    optimize(ast).to_program()
    cg.append(time.perf_counter() - t0)
    cg_cpu.append(time.thread_time() - c0)
  k = optimize(w.build())
  prg = k.to_program()
  runner = dev.compile(prg)
  inputs = w.inputs(np.random.default_rng(0))
  bufs = {idx: Buffer(dev.name, numel, dtypes.float32) for idx, numel in w.buffers}
  for idx, arr in inputs.items(): bufs[idx].copyin(arr)
  args = [bufs[a.idx] for a in prg.args]
  runner(*args, wait=True)
  ref, got = w.reference(inputs), bufs[0].numpy()
  np.testing.assert_allclose(got, ref, rtol=w.tol, atol=w.tol * max(1.0, float(np.abs(ref).max())))
  ts = []
  for _ in range(repeats):
    t0 = time.perf_counter(); runner(*args, wait=True); ts.append(time.perf_counter() - t0)
  out[name] = {"kernel_s": statistics.median(ts), "codegen_s": statistics.median(cg), "codegen_min_s": min(cg_cpu),
               "name": prg.name,
               "opts": [str(o) for o in k.applied_opts]}
for path in [p for p in sys.argv[6].split(",") if p]:
  # an AST file (benchmarks/asts/): cold codegen only, the AST loaded afresh each repeat
  import kernopt
  cg, cg_cpu = [], []
  for _ in range(repeats):
    ast = kernopt.load(path)
    t0, c0 = time.perf_counter(), time.thread_time()
    k = optimize(ast); k.to_program()
    cg.append(time.perf_counter() - t0)
    cg_cpu.append(time.thread_time() - c0)
  out[os.path.basename(path)] = {"kernel_s": None, "codegen_s": statistics.median(cg), "codegen_min_s": min(cg_cpu),
                                 "name": "",
                                 "opts": [str(o) for o in k.applied_opts]}
print(json.dumps(out))
'''

# a tree's codegen server for the paired measurement: reads a workload name or an AST file path per line, answers the
# thread time of one cold codegen of it (a freshly built AST, the standard protocol, to_program)
PAIRED_DRIVER = r'''
import os, sys, time
tree = sys.argv[1]
sys.path[:0] = [tree, os.path.join(tree, "benchmarks"), os.path.join(tree, "tests")]
import kernopt
from workloads import workloads
from kernopt.kernel import Kernel
from kernopt.runtime import Device
dev = Device.open("CPU", threads=int(sys.argv[2]))
all_w = workloads()
for line in sys.stdin:
  n = line.strip()
  ast = all_w[n].build() if n in all_w else kernopt.load(n)
  c0 = time.thread_time()
  k = Kernel(ast, opts=dev.renderer).required_optimizations()
  if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  k.to_program()
  print(time.thread_time() - c0, flush=True)
'''

# a pair is quiet when both its times are within this factor of their tree's least time over the pairs
QUIET = 1.15

def paired_codegen(base: str, names: list[str], pairs: int,
                   threads: int) -> dict[str, tuple[float, float, float, Optional[float], int]]:
  """Cold codegen of each workload (name, or AST file path) timed in one long-lived process per tree, the two
  alternated call by call (the first of each pair swapped every pair), so both meet the same host speed within a few
  milliseconds: per workload (median base/this ratio over the pairs, base's median ms, this tree's median ms, the
  median ratio over the quiet pairs (None when none), their count). A quiet pair has both times within QUIET of
  their tree's least: this host's slow phases slow the two trees by different factors (W5 +11% base, +75% this
  tree in one stretch), so the all-pairs median moves with how much of the run they cover."""
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  procs = {who: subprocess.Popen([sys.executable, "-c", PAIRED_DRIVER, tree, str(threads)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env=env, cwd=tree)
           for who, tree in (("base", base), ("this", ROOT))}
  def once(who: str, n: str) -> float:
    p = procs[who]
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(n + "\n")
    p.stdin.flush()
    if not (ans := p.stdout.readline()): raise SystemExit(f"{who}: the paired codegen of {n} failed")
    return float(ans)
  out = {}
  try:
    for n in names:
      once("base", n), once("this", n)   # warm-up: imports and first-call caches
      t: dict[str, list[float]] = {"base": [], "this": []}
      for i in range(pairs):
        for who in (("base", "this") if i % 2 == 0 else ("this", "base")): t[who].append(once(who, n))
      lb, lh = min(t["base"]), min(t["this"])
      quiet = [b / h for b, h in zip(t["base"], t["this"]) if b <= QUIET * lb and h <= QUIET * lh]
      out[n] = (statistics.median(b / h for b, h in zip(t["base"], t["this"])), 1e3 * statistics.median(t["base"]),
                1e3 * statistics.median(t["this"]), statistics.median(quiet) if quiet else None, len(quiet))
  finally:
    for p in procs.values():
      if p.stdin is not None: p.stdin.close()
      p.wait()
  return out

def export(rev: str, dest: str) -> str:
  """The tree of git revision `rev` under `dest` (kernopt, benchmarks and tests only)."""
  archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "kernopt", "benchmarks", "tests"], check=True,
                           capture_output=True).stdout
  os.makedirs(dest)
  subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
  return dest

def run_tree(tree: str, names: list[str], repeats: int, threads: int, profile: str, cache: str,
             asts: tuple[str, ...] = ()) -> dict:
  """One process of `tree` timing `names` (and the codegen of the AST files `asts`); each tree has its own cache
  directory (their formats may differ)."""
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env["CACHE_DIR"] = cache
  r = subprocess.run([sys.executable, "-c", DRIVER, tree, ",".join(names), str(repeats), str(threads), profile,
                      ",".join(asts)],
                     capture_output=True, text=True, env=env, cwd=tree)
  if r.returncode != 0: raise SystemExit(f"{tree}: the benchmark failed:\n{r.stderr[-3000:]}")
  return json.loads(r.stdout.strip().splitlines()[-1])

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--base", required=True, help="the git revision to compare with")
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--repeats", type=int, default=7)
  ap.add_argument("--workloads", default="")
  ap.add_argument("--threads", default="1")
  ap.add_argument("--profile", default="native", choices=("native", "static"))
  ap.add_argument("--pairs", type=int, default=0,
                  help="also time cold codegen as this many pairs alternated call by call between two long-lived "
                       "processes (the median of the per-pair ratios: robust to a host whose speed drifts)")
  ap.add_argument("--asts", default="benchmarks/asts/mlp_l1.json",
                  help="AST files (comma-separated, from this tree) whose cold codegen is timed too (issue 16: "
                       "the MLP's 64x784x256 matmul)")
  a = ap.parse_args()
  asts = tuple(os.path.join(ROOT, p.strip()) for p in a.asts.split(",") if p.strip())
  sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]
  from workloads import workloads
  names = [n.strip() for n in a.workloads.split(",") if n.strip()] or list(workloads())
  cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
             platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
  rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", a.base], check=True, capture_output=True,
                       text=True).stdout.strip()
  print(f"A/B: base {a.base} ({rev}) against this tree; host CPU {cpu}; {a.rounds} rounds x {a.repeats} repeats; "
        f"profile {a.profile}")
  with tempfile.TemporaryDirectory() as tmp:
    base = export(a.base, os.path.join(tmp, "tree"))
    for t in ([1] if a.profile == "static" else [int(x) for x in a.threads.split(",")]):
      ratios: dict[str, list[float]] = {n: [] for n in names}
      cg_ratios: dict[str, list[float]] = {n: [] for n in names}
      cg_min: dict[str, list[float]] = {}   # per workload: the least codegen thread time of base, of this tree
      last: dict[str, tuple[dict, dict]] = {}
      for rnd in range(a.rounds):
        order = [("base", base), ("this", ROOT)][:: 1 if rnd % 2 == 0 else -1]
        res = {who: run_tree(tree, names, a.repeats, t, a.profile, os.path.join(tmp, f"cache-{who}"), asts)
               for who, tree in order}
        for n in names + [os.path.basename(p) for p in asts]:
          if n in res["base"] and n in res["this"]:
            b, h = res["base"][n], res["this"][n]
            if b["kernel_s"] is not None: ratios.setdefault(n, []).append(b["kernel_s"] / h["kernel_s"])
            cg_ratios.setdefault(n, []).append(b["codegen_s"] / h["codegen_s"])
            if "codegen_min_s" in b and "codegen_min_s" in h:
              m = cg_min.setdefault(n, [math.inf, math.inf])
              m[0], m[1] = min(m[0], b["codegen_min_s"]), min(m[1], h["codegen_min_s"])
            last[n] = (b, h)
        print(f"  round {rnd + 1}/{a.rounds} done", flush=True)
      print(f"threads {t}:")
      print(f"  {'wl':4s} {'base ms':>9s} {'this ms':>9s} {'kernel base/this':>17s} {'(min-max)':>13s} "
            f"{'codegen base/this':>18s} {'(least cpu ms)':>20s}  same opts")
      for n in names:
        if not ratios[n]: print(f"  {n:4s} only in one tree"); continue
        b, h = last[n]
        print(f"  {n:4s} {1e3 * b['kernel_s']:9.3f} {1e3 * h['kernel_s']:9.3f} {statistics.median(ratios[n]):16.3f}x "
              f"({min(ratios[n]):.2f}-{max(ratios[n]):.2f}) {statistics.median(cg_ratios[n]):17.3f}x "
              f"{_least(cg_min.get(n)):>20s}  "
              f"{'yes' if b['opts'] == h['opts'] else 'no: ' + str(b['opts']) + ' -> ' + str(h['opts'])}")
      for p in asts:
        n = os.path.basename(p)
        if n not in last: print(f"  {n}: only in one tree"); continue
        b, h = last[n]
        print(f"  {n}: codegen {1e3 * b['codegen_s']:.2f} -> {1e3 * h['codegen_s']:.2f} ms, base/this "
              f"{statistics.median(cg_ratios[n]):.3f}x, least cpu {_least(cg_min.get(n))}  "
              f"{'same opts' if b['opts'] == h['opts'] else 'other opts'}")
      if a.pairs:
        paired = paired_codegen(base, names + list(asts), a.pairs, t)
        print(f"  paired codegen ({a.pairs} alternated pairs, one process per tree; quiet: both within {QUIET}x of "
              f"their least): " + "; ".join(
                f"{os.path.basename(n)} {bm:.2f} -> {hm:.2f} ms {r:.2f}x, quiet "
                f"{'-' if q is None else f'{q:.2f}x'} ({nq})" for n, (r, bm, hm, q, nq) in paired.items()))
  print("kernel base/this > 1: this tree's kernel is faster; ms columns are the last round's medians; least cpu: "
        "each tree's least codegen thread time over every repeat and round, and their ratio (a host with slow "
        "phases moves the medians; a quiet moment of each tree is still met)")

def _least(m: "list[float] | None") -> str:
  """'base -> this ms = ratio' of the least codegen thread times, or '-' (a tree without the figure)."""
  if not m or math.inf in m: return "-"
  return f"{1e3 * m[0]:.2f}->{1e3 * m[1]:.2f} {m[0] / m[1]:.2f}x"

if __name__ == "__main__":
  main()
