"""kernopt inside a framework's JIT: framework-shaped ASTs (an MLP forward, attention's two matmuls, a conv block;
saved under benchmarks/asts/) built through kernopt.compile in a cold process and then in a warm one sharing its
cache directory. Prints per kernel and in total the codegen time (AST to Program) cold and warm and their ratio, and
the cold build wall time with compile_many (compilers in parallel) against the same kernels compiled one at a time
with the cache off, medians over rounds, every process fresh.
  python3 benchmarks/bench_embed.py [rounds]      (default 3)
  python3 benchmarks/bench_embed.py --save-asts   (rewrites benchmarks/asts/*.json)
  python3 benchmarks/bench_embed.py --tensor [rounds]   (only examples/tensor's models end to end; also run last by
                                                        the default; benchmarks/asts/tensor/ holds their kernels)"""
from __future__ import annotations
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ASTS = os.path.join(HERE, "asts")
sys.path.insert(0, os.path.join(HERE, ".."))

def build_asts() -> dict[str, Any]:
  """name -> AST, as a lazy tensor library would schedule them (a reduce fused with the elementwise ops after it)."""
  from kernopt import ast as A, dtypes
  f = dtypes.float
  def matmul(a: Any, b: Any, m: int, k: int, n: int) -> Any:
    """a (m, k) @ b (k, n) at the shape (m, n, 1): a broadcast over n, b transposed and broadcast over m."""
    x = A.expand(A.reshape(a, (m, 1, k)), (m, n, k))
    y = A.expand(A.reshape(A.permute(b, (1, 0)), (1, n, k)), (m, n, k))
    return A.sum(A.mul(x, y), 2)
  def bias(idx: int, m: int, n: int) -> Any: return A.expand(A.load(idx, f, (1, n, 1)), (m, n, 1))
  def relu(x: Any) -> Any: return A.maximum(x, 0.0)
  asts = {}
  # an MLP forward on a batch of 64: 784 -> 256 -> 10
  asts["mlp_l1"] = A.kernel(A.store(0, relu(A.add(matmul(A.load(1, f, (64, 784)), A.load(2, f, (784, 256)), 64, 784,
                                                         256), bias(3, 64, 256)))))
  asts["mlp_l2"] = A.kernel(A.store(0, A.add(matmul(A.load(1, f, (64, 256)), A.load(2, f, (256, 10)), 64, 256, 10),
                                             bias(3, 64, 10))))
  # attention's matmuls (one head, 128 tokens, 64 dims): scores = q @ k^T * 1/8, out = p @ v
  q, kt = A.load(1, f, (128, 64)), A.permute(A.load(2, f, (128, 64)), (1, 0))
  asts["attn_scores"] = A.kernel(A.store(0, A.mul(matmul(q, kt, 128, 64, 128), 0.125)))
  asts["attn_out"] = A.kernel(A.store(0, matmul(A.load(1, f, (128, 128)), A.load(2, f, (128, 64)), 128, 128, 64)))
  # a conv block: 3x3 conv, padding 1, 16 -> 16 channels on 32x32, + bias, relu; then a 2x2 sum pool
  c, h, w = 16, 32, 32
  x = A.pad(A.load(1, f, (1, c, h, w)), ((0, 0), (0, 0), (1, 1), (1, 1)))
  from kernopt.shape.shapetracker import ShapeTracker
  from kernopt.shape.view import View
  # windows: (cout, h, w, cin, ky, kx) over the padded input
  win = View.create((c, h, w, c, 3, 3), (0, w + 2, 1, (h + 2) * (w + 2), w + 2, 1))
  xs = A.compose(x, ShapeTracker((win,)))
  wt = A.expand(A.reshape(A.load(2, f, (c, c, 3, 3)), (c, 1, 1, c, 3, 3)), (c, h, w, c, 3, 3))
  conv = A.sum(A.mul(xs, wt), (3, 4, 5))
  asts["conv3x3"] = A.kernel(A.store(0, relu(A.add(conv, A.expand(A.load(3, f, (c, 1, 1, 1, 1, 1)),
                                                                  (c, h, w, 1, 1, 1))))))
  pool = View.create((c, h // 2, w // 2, 2, 2), (h * w, 2 * w, 2, w, 1))
  asts["pool2x2"] = A.kernel(A.store(0, A.sum(A.compose(A.load(1, f, (c * h * w,)), ShapeTracker((pool,))),
                                               (3, 4))))
  return asts

def save_asts() -> None:
  from kernopt.ops import ast_to_json
  os.makedirs(ASTS, exist_ok=True)
  for name, ast in build_asts().items():
    with open(os.path.join(ASTS, f"{name}.json"), "w") as f: json.dump(ast_to_json(ast), f, indent=None)
  print(f"wrote {len(build_asts())} ASTs to {ASTS}")

def load_asts() -> dict[str, Any]:
  from kernopt.ops import ast_from_json
  ret = {}
  for name in sorted(n for n in os.listdir(ASTS) if n.endswith(".json")):
    with open(os.path.join(ASTS, name)) as f: ret[name.removesuffix(".json")] = ast_from_json(json.load(f))
  return ret

def child(mode: str) -> None:
  """One fresh process: `codegen` times program() per kernel then compiles; `many` / `serial` time the whole build."""
  import kernopt
  from kernopt import api
  asts = load_asts()
  out: dict[str, Any] = {}
  # what any process pays once, before its first kernel: the device, numpy, the compiler probe, the cache database
  from kernopt.helpers import diskcache_get, source_digest
  kernopt.Device["CPU"].flags()
  source_digest()
  diskcache_get(api.program_cache.TABLE, "warm-up")
  if mode == "codegen":
    for name, ast in asts.items():
      t0 = time.perf_counter()
      prg = api.program(ast, "CPU")
      out[name] = 1e3 * (time.perf_counter() - t0)
      kernopt.Device["CPU"].compile(prg)
  else:
    t0 = time.perf_counter()
    if mode == "many": kernopt.compile_many(list(asts.values()), "CPU")
    else:
      for ast in asts.values(): kernopt.compile(ast, "CPU", cache=False)
    out["wall_s"] = time.perf_counter() - t0
  out["stats"] = kernopt.stats()
  print(json.dumps(out))

def tensor_child() -> None:
  """examples/tensor's models end to end (build the graph, schedule, compile_many, run, read back) in this process:
  the first call and a warm second one per model, with the kernel count and each kernel's fused shape."""
  import numpy as np
  from kernopt import Variable
  from examples.tensor import fused_shape, realize_all
  from examples.tensor import models as M
  out: dict[str, Any] = {}
  for name in M.MODELS:
    times, shapes = [], []
    for _ in range(2):
      t0 = time.perf_counter()
      _, outs = M.build(name, 16, "CPU", np.random.default_rng(0), Variable("batch", 1, 64), grad=name == "mlp")
      ks = realize_all(*outs)
      [o.numpy() for o in outs]
      times.append(1e3 * (time.perf_counter() - t0))
      shapes = [str(fused_shape(k.ast)).replace("<batch[1..64]>", "B") for k in ks]
    out[name] = {"first_ms": times[0], "warm_ms": times[1], "kernels": shapes}
  print(json.dumps(out))

def tensor_main(rounds: int) -> None:
  """Per model: first call in a cold process, warm call, first call in a warm second process; medians."""
  first: dict[str, list[float]] = {}
  warm: dict[str, list[float]] = {}
  second: dict[str, list[float]] = {}
  shapes: dict[str, list[str]] = {}
  for _ in range(rounds):
    with tempfile.TemporaryDirectory(prefix="kernopt_tensor_") as d:
      a, b = run_child("tensor", d), run_child("tensor", d)
      for name in a:
        first.setdefault(name, []).append(a[name]["first_ms"])
        warm.setdefault(name, []).append(a[name]["warm_ms"])
        second.setdefault(name, []).append(b[name]["first_ms"])
        shapes[name] = a[name]["kernels"]
  print(f"examples/tensor models end to end on CPU, batch 16 of a symbolic batch; medians of {rounds} rounds")
  print(f"{'model':10s} {'first ms':>9s} {'warm ms':>9s} {'2nd proc ms':>11s} {'kernels':>7s}  fused shapes")
  for name in first:
    print(f"{name:10s} {statistics.median(first[name]):9.1f} {statistics.median(warm[name]):9.1f} "
          f"{statistics.median(second[name]):11.1f} {len(shapes[name]):7d}  {' '.join(shapes[name])}")

def run_child(mode: str, cache_dir: str, disable_cache: bool = False) -> dict[str, Any]:
  env = {**os.environ, "CACHE_DIR": cache_dir, "DISABLE_CACHE": "1" if disable_cache else "0"}
  res = subprocess.run([sys.executable, __file__, "--child", mode], capture_output=True, text=True, env=env,
                       timeout=900)
  if res.returncode != 0: raise SystemExit(f"child {mode} failed:\n{res.stderr}")
  return json.loads(res.stdout.strip().splitlines()[-1])

def main(rounds: int) -> None:
  import kernopt
  print(f"host: {platform.processor() or platform.machine()}, {_cpu_model()}, {os.cpu_count()} cpus; "
        f"kernopt {kernopt.__version__}; {rounds} rounds, every process fresh")
  cold: dict[str, list[float]] = {}
  warm: dict[str, list[float]] = {}
  many, serial = [], []
  for _ in range(rounds):
    with tempfile.TemporaryDirectory(prefix="kernopt_embed_") as d:
      c = run_child("codegen", os.path.join(d, "a"))
      w = run_child("codegen", os.path.join(d, "a"))
      assert w["stats"]["lowerings"] == 0 and w["stats"]["renders"] == 0, w["stats"]
      for name in c:
        if name == "stats": continue
        cold.setdefault(name, []).append(c[name])
        warm.setdefault(name, []).append(w[name])
      many.append(run_child("many", os.path.join(d, "b"))["wall_s"])
      serial.append(run_child("serial", os.path.join(d, "c"), disable_cache=True)["wall_s"])
  print(f"{'kernel':14s} {'cold ms':>9s} {'warm ms':>9s} {'warm/cold':>9s}")
  tc = tw = 0.0
  for name in cold:
    mc, mw = statistics.median(cold[name]), statistics.median(warm[name])
    tc, tw = tc + mc, tw + mw
    print(f"{name:14s} {mc:9.2f} {mw:9.2f} {mw / mc:9.3f}")
  print(f"{'total':14s} {tc:9.2f} {tw:9.2f} {tw / tc:9.3f}")
  mm, ms = statistics.median(many), statistics.median(serial)
  print(f"cold build of {len(cold)} kernels: compile_many {mm:.2f} s, one at a time with the cache off {ms:.2f} s, "
        f"ratio {mm / ms:.2f}")
  tensor_main(rounds)

def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "unknown CPU")
  except OSError: return "unknown CPU"

if __name__ == "__main__":
  if sys.argv[1:3] == ["--child", "tensor"]: tensor_child()
  elif sys.argv[1:2] == ["--child"]: child(sys.argv[2])
  elif sys.argv[1:2] == ["--tensor"]: tensor_main(int(sys.argv[2]) if len(sys.argv) > 2 else 3)
  elif sys.argv[1:2] == ["--save-asts"]: save_asts()
  else: main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
