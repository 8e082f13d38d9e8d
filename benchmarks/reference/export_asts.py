"""Runs inside the reference's venv (tinygrad 0.9.2, CLANG backend; benchmarks/reference/setup_reference.sh makes it).
For each row of rows.py: the inputs (seeded numpy arrays, realized first so only the row's own kernels are scheduled),
tinygrad's `create_schedule` on the row's output, every scheduled kernel AST dumped to a neutral JSON (ops by name,
views as shape/strides/offset/mask/contiguous, buffers by index with dtypes by name, consts with their values), which
buffer of the row each kernel argument is, and the reference's own output (small outputs whole as .npy, big ones as a
checksum and sampled elements). `--time` instead prints each row's CLANG time as JSON: the sum of the row's kernel
times (each kernel launched with wait=True, compile excluded), median over repeats.
  export_asts.py [--out DIR] [--rows a,b] | export_asts.py --time [--rows a,b] [--repeats N]"""
import os
os.environ.setdefault("CLANG", "1")
import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
from rows import BY_NAME, ROWS, SMALL_ROWS  # noqa: E402
from tinygrad import Device, Tensor  # noqa: E402
from tinygrad.engine.realize import lower_schedule  # noqa: E402
from tinygrad.engine.schedule import create_schedule  # noqa: E402
from tinygrad.ops import ConstBuffer, LazyOp, MemBuffer, MetaOps  # noqa: E402
from tinygrad.shape.shapetracker import ShapeTracker  # noqa: E402

SMALL = 4096        # outputs up to this many elements are saved whole
SAMPLES = 64

class ExportError(Exception): pass

def _int(x) -> int:
  if not isinstance(x, int): raise ExportError(f"symbolic value {x!r} in a view: only concrete shapes are exported")
  return x

def enc_value(x):
  if isinstance(x, bool) or x is None: return x
  if isinstance(x, int): return x
  if isinstance(x, float): return x if math.isfinite(x) else {"float": repr(x)}
  raise ExportError(f"cannot export the constant {x!r} ({type(x).__name__})")

def enc_st(st: ShapeTracker) -> list:
  return [{"shape": [_int(s) for s in v.shape], "strides": [_int(s) for s in v.strides], "offset": _int(v.offset),
           "mask": None if v.mask is None else [[_int(a), _int(b)] for a, b in v.mask], "contiguous": v.contiguous}
          for v in st.views]

def enc_arg(op: LazyOp):
  a = op.arg
  if isinstance(a, MemBuffer): return {"kind": "MemBuffer", "idx": a.idx, "dtype": a.dtype.name, "st": enc_st(a.st)}
  if isinstance(a, ConstBuffer):
    return {"kind": "ConstBuffer", "val": enc_value(a.val), "dtype": a.dtype.name, "st": enc_st(a.st)}
  if a is None: return None
  if op.op.name in ("CAST", "BITCAST"): return {"kind": "dtype", "name": a.name}
  if isinstance(a, tuple) and all(isinstance(x, int) for x in a): return {"kind": "axes", "axes": list(a)}
  raise ExportError(f"cannot export the arg {a!r} of {op.op}")

def enc_ast(ast: LazyOp) -> dict:
  """The AST as a node list, children before parents, each distinct node once; sources by index."""
  index: dict = {}
  nodes: list = []
  def visit(x: LazyOp) -> int:
    if (i := index.get(id(x))) is not None: return i
    src = [visit(s) for s in x.src]
    nodes.append({"op": f"{type(x.op).__name__}.{x.op.name}", "src": src, "arg": enc_arg(x)})
    index[id(x)] = len(nodes) - 1
    return len(nodes) - 1
  return {"nodes": nodes, "root": visit(ast)}

def schedule_row(row, seed: int = 0):
  """(input arrays, the row's schedule, its output Tensor), the inputs already realized on CLANG."""
  arrays = row.arrays(seed)
  ins = [Tensor(a).realize() for a in arrays]
  out = row.tinygrad(*ins)
  return arrays, ins, create_schedule([out.lazydata]), out

def wiring(sched, ins, names) -> list:
  """For each kernel, for each of its buffers: the input it is, or the earlier kernel output it is."""
  made: dict = {}
  inputs = {id(t.lazydata.base.buffer): n for t, n in zip(ins, names)}
  ret = []
  for k, si in enumerate(sched):
    if si.ast.op is not MetaOps.KERNEL: raise ExportError(f"kernel {k} is a {si.ast.op}, not a KERNEL")
    bufs = []
    for j, b in enumerate(si.bufs):
      where = {"input": inputs[id(b)]} if id(b) in inputs else made.get(id(b))
      if j < len(si.ast.src):
        if where is not None and "input" in where: raise ExportError(f"kernel {k} writes the input {where['input']}")
        where = made[id(b)] = {"kernel": k, "buf": j}
      if where is None: raise ExportError(f"kernel {k} buffer {j} is neither an input nor an earlier output")
      bufs.append({**where, "size": b.size, "dtype": b.dtype.name})
    ret.append(bufs)
  return ret

def kernel_bytes(si) -> int:
  return sum(b.nbytes for b in {id(b): b for b in si.bufs}.values())

def export(row, out_dir: str) -> dict:
  arrays, ins, sched, out = schedule_row(row)
  names = [n for n, _ in row.inputs]
  kernels = [{"ast": enc_ast(si.ast), "bytes": kernel_bytes(si)} for si in sched]
  for kern, bufs in zip(kernels, wiring(sched, ins, names)): kern["bufs"] = bufs
  eis = list(lower_schedule(list(sched)))
  for ei in eis: ei.run(wait=True)
  outbuf = sched[-1].bufs[0]
  got = np.frombuffer(outbuf.as_buffer(), dtype=np.float32).copy()
  if outbuf is not out.lazydata.base.buffer: raise ExportError("the last kernel does not write the row's output")
  check: dict = {"kernel": len(sched) - 1, "buf": 0, "shape": list(out.shape), "size": int(got.size),
                 "sum": float(got.astype(np.float64).sum()), "abs_sum": float(np.abs(got.astype(np.float64)).sum())}
  if got.size <= SMALL:
    np.save(os.path.join(out_dir, f"{row.name}.npy"), got.reshape(out.shape))
    check["npy"] = f"{row.name}.npy"
  else:
    idx = np.random.default_rng(1).choice(got.size, SAMPLES, replace=False)
    check["samples"] = {"index": [int(i) for i in idx], "value": [float(got[i]) for i in idx]}
  want = row.numpy(*arrays).reshape(-1)
  err = float(np.abs(got - want).max() / max(1.0, float(np.abs(want).max())))
  return {"row": row.name, "inputs": [{"name": n, "shape": list(s), "seed": i, "dtype": "float",
                                       "dist": "standard_normal"} for i, (n, s) in enumerate(row.inputs)],
          "kernels": kernels, "output": check, "reference_vs_numpy_max_rel_err": err}

def time_row(row, repeats: int) -> dict:
  _, _, sched, _ = schedule_row(row)
  eis = list(lower_schedule(list(sched)))
  for ei in eis: ei.run(wait=True)   # compiled by lower_schedule; one warm-up launch
  per: list = []
  for _ in range(repeats): per.append([ei.run(wait=True, do_update_stats=False) for ei in eis])
  return {"seconds": statistics.median(sum(p) for p in per),
          "kernel_seconds": [statistics.median(p[k] for p in per) for k in range(len(eis))]}

def compiler() -> str:
  return subprocess.run(["clang", "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[0]

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  here = os.path.dirname(os.path.abspath(__file__))
  ap.add_argument("--out", default=os.path.join(here, "export"))
  ap.add_argument("--rows", default="", help="comma-separated row names (default: all)")
  ap.add_argument("--time", action="store_true", help="print the rows' CLANG times as JSON instead of exporting")
  ap.add_argument("--repeats", type=int, default=5)
  a = ap.parse_args()
  if Device.DEFAULT != "CLANG": raise SystemExit(f"the reference must run on CLANG, got {Device.DEFAULT}")
  rows = [BY_NAME[n] for n in a.rows.split(",")] if a.rows else list(ROWS + SMALL_ROWS)
  if a.time:
    print(json.dumps({"compiler": compiler(), "rows": {r.name: time_row(r, a.repeats) for r in rows}}))
    return
  os.makedirs(a.out, exist_ok=True)
  print(f"reference: tinygrad on {Device.DEFAULT}, compiler: {compiler()}")
  tpath = os.path.join(a.out, "times.json")
  times = {}
  if os.path.exists(tpath):   # rows not exported this time keep their times
    with open(tpath) as f: times = json.load(f)["rows"]
  for r in rows:
    d = export(r, a.out)
    with open(os.path.join(a.out, f"{r.name}.json"), "w") as f: json.dump(d, f, indent=1)
    times[r.name] = time_row(r, a.repeats)
    print(f"{r.name:22s} {len(d['kernels'])} kernel(s), reference vs numpy max rel err "
          f"{d['reference_vs_numpy_max_rel_err']:.2e}, CLANG {1e3 * times[r.name]['seconds']:.3f} ms", flush=True)
  with open(tpath, "w") as f: json.dump({"compiler": compiler(), "rows": times}, f, indent=1)

if __name__ == "__main__":
  main()
