"""The reference's scheduled kernel ASTs (export_asts.py's neutral JSON, made by tinygrad 0.9.2) as kernopt objects:
each op mapped by name through one explicit table (anything else is refused with TranslateError naming it), views
rebuilt with View.create and checked to keep their contiguity, dtypes by name. Run as a script it translates every row
of benchmarks/reference/export/ and saves each kernel with kernopt.save as benchmarks/asts/reference/<row>_<k>.json.
Imports only kernopt and the standard library.
  python benchmarks/reference/translate.py [--export DIR] [--asts DIR]"""
from __future__ import annotations
import argparse
import glob
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Optional
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
import kernopt  # noqa: E402
from kernopt.dtype import DType, dtypes  # noqa: E402
from kernopt.errors import UnsupportedError  # noqa: E402
from kernopt.ops import (BinaryOps, BufferOps, ConstBuffer, LazyOp, MemBuffer, MetaOps, ReduceOps, TernaryOps,  # noqa: E402
                         UnaryOps, verify_lazyop)
from kernopt.shape.shapetracker import ShapeTracker  # noqa: E402
from kernopt.shape.view import View  # noqa: E402

EXPORT_DIR = os.path.join(HERE, "export")
ASTS_DIR = os.path.normpath(os.path.join(HERE, "..", "asts", "reference"))

class TranslateError(UnsupportedError):
  """An op, arg, dtype or view of the reference's AST that has no kernopt counterpart."""

# tinygrad 0.9.2's op names -> kernopt's. Semantics agree on every op listed (DESIGN.md's op table: float IDIV is true
# division, MAX is a > b ? a : b, CMPLT/CMPNE give bool). Left out on purpose: BinaryOps.THREEFRY (tinygrad's random
# numbers; kernopt has no such op), ReduceOps.WMMA (only after tinygrad's own optimizer) and the MetaOps other than
# KERNEL (copies, views, customs: not kernels).
OPS: dict[str, Any] = {
  **{f"UnaryOps.{n}": getattr(UnaryOps, n) for n in ("EXP2", "LOG2", "CAST", "BITCAST", "SIN", "SQRT", "NEG", "RECIP")},
  **{f"BinaryOps.{n}": getattr(BinaryOps, n)
     for n in ("ADD", "MUL", "IDIV", "MAX", "MOD", "CMPLT", "CMPNE", "XOR", "SHL", "SHR", "OR", "AND")},
  "TernaryOps.WHERE": TernaryOps.WHERE, "TernaryOps.MULACC": TernaryOps.MULACC,
  "ReduceOps.SUM": ReduceOps.SUM, "ReduceOps.MAX": ReduceOps.MAX,
  "BufferOps.LOAD": BufferOps.LOAD, "BufferOps.CONST": BufferOps.CONST, "BufferOps.STORE": BufferOps.STORE,
  "MetaOps.KERNEL": MetaOps.KERNEL,
}

# tinygrad 0.9.2's dtype names -> kernopt's dtypes
DTYPES: dict[str, DType] = {"bool": dtypes.bool, "char": dtypes.int8, "unsigned char": dtypes.uint8,
                            "short": dtypes.int16, "unsigned short": dtypes.uint16, "int": dtypes.int32,
                            "unsigned int": dtypes.uint32, "long": dtypes.int64, "unsigned long": dtypes.uint64,
                            "half": dtypes.float16, "__bf16": dtypes.bfloat16, "float": dtypes.float32,
                            "double": dtypes.float64}

def dtype(name: Any) -> DType:
  if name not in DTYPES: raise TranslateError(f"unknown dtype {name!r}; known: {sorted(DTYPES)}")
  return DTYPES[name]

def _ints(xs: Any, what: str) -> tuple[int, ...]:
  if not isinstance(xs, list) or not all(type(x) is int for x in xs):
    raise TranslateError(f"{what} must be a list of ints, got {xs!r}")
  return tuple(xs)

def view(d: dict) -> View:
  shape, strides = _ints(d["shape"], "a view's shape"), _ints(d["strides"], "a view's strides")
  if type(d["offset"]) is not int: raise TranslateError(f"a view's offset must be an int, got {d['offset']!r}")
  mask = None if d["mask"] is None else tuple(_ints(m, "a mask entry") for m in d["mask"])
  v = View.create(shape, strides, d["offset"], mask)   # type: ignore[arg-type]
  if v.contiguous != d["contiguous"]:
    raise TranslateError(f"view {d} has contiguous={d['contiguous']} in the reference but contiguous={v.contiguous} "
                         f"in kernopt ({v})")
  return v

def tracker(views: list) -> ShapeTracker:
  if not isinstance(views, list) or not views: raise TranslateError(f"a ShapeTracker needs views, got {views!r}")
  return ShapeTracker(tuple(view(v) for v in views))

def const(v: Any) -> Any:
  if isinstance(v, dict):
    if set(v) != {"float"} or v["float"] not in ("inf", "-inf", "nan"): raise TranslateError(f"bad constant {v!r}")
    return float(v["float"])
  if v is None or not isinstance(v, (bool, int, float)): raise TranslateError(f"bad constant {v!r}")
  return v

def arg(op: Any, a: Any) -> Any:
  kind = a.get("kind") if isinstance(a, dict) else None
  if op in (BufferOps.LOAD, BufferOps.STORE):
    if kind != "MemBuffer": raise TranslateError(f"{op} needs a MemBuffer arg, got {a!r}")
    return MemBuffer(a["idx"], dtype(a["dtype"]), tracker(a["st"]))
  if op is BufferOps.CONST:
    if kind != "ConstBuffer": raise TranslateError(f"{op} needs a ConstBuffer arg, got {a!r}")
    return ConstBuffer(const(a["val"]), dtype(a["dtype"]), tracker(a["st"]))
  if op in (UnaryOps.CAST, UnaryOps.BITCAST):
    if kind != "dtype": raise TranslateError(f"{op} needs a dtype arg, got {a!r}")
    return dtype(a["name"])
  if op in ReduceOps:
    if kind != "axes": raise TranslateError(f"{op} needs its reduce axes, got {a!r}")
    return _ints(a["axes"], f"{op}'s axes")
  if a is not None: raise TranslateError(f"{op} takes no arg in the reference's schedule, got {a!r}")
  return None

def translate(neutral: dict) -> LazyOp:
  """One kernel of export_asts.py's JSON ({"nodes": [...], "root": i}) as a verified kernopt LazyOp."""
  built: list[LazyOp] = []
  for i, n in enumerate(neutral["nodes"]):
    if n["op"] not in OPS:
      raise TranslateError(f"node {i}: the reference's op {n['op']} has no kernopt counterpart (known: {sorted(OPS)})")
    if any(type(s) is not int or not 0 <= s < i for s in n["src"]): raise TranslateError(f"node {i}: bad sources")
    op = OPS[n["op"]]
    built.append(LazyOp(op, tuple(built[s] for s in n["src"]), arg(op, n["arg"])))
  ast = built[neutral["root"]]
  if ast.op is not MetaOps.KERNEL: raise TranslateError(f"the root is {ast.op}, not a KERNEL")
  verify_lazyop(ast)
  return ast

@dataclass(frozen=True)
class RefKernel:
  ast: LazyOp
  bufs: tuple[dict, ...]   # per MemBuffer idx: {"input": name} or {"kernel": k, "buf": j}, with size and dtype
  nbytes: int              # distinct bytes the kernel reads and writes

@dataclass(frozen=True)
class RefRow:
  name: str
  inputs: tuple[dict, ...]   # name, shape, seed, dtype, dist
  kernels: tuple[RefKernel, ...]
  output: dict               # kernel, buf, shape, size, sum, abs_sum, and npy (a path) or samples
  export: dict

def ast_path(row: str, k: int, asts_dir: str = ASTS_DIR) -> str: return os.path.join(asts_dir, f"{row}_{k}.json")

def load_rows(export_dir: str = EXPORT_DIR, asts_dir: Optional[str] = ASTS_DIR) -> dict[str, RefRow]:
  """Every exported row, its kernels' ASTs loaded from `asts_dir` (kernopt.load), or translated afresh when None."""
  rows = {}
  for path in sorted(glob.glob(os.path.join(export_dir, "*.json"))):
    if os.path.basename(path) == "times.json": continue
    with open(path) as f: d = json.load(f)
    asts = [translate(k["ast"]) if asts_dir is None else kernopt.load(ast_path(d["row"], i, asts_dir))
            for i, k in enumerate(d["kernels"])]
    kernels = tuple(RefKernel(ast, tuple(k["bufs"]), k["bytes"]) for ast, k in zip(asts, d["kernels"]))
    out = dict(d["output"])
    if "npy" in out: out["npy"] = os.path.join(export_dir, out["npy"])
    rows[d["row"]] = RefRow(d["row"], tuple(d["inputs"]), kernels, out, d)
  return rows

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--export", default=EXPORT_DIR)
  ap.add_argument("--asts", default=ASTS_DIR)
  a = ap.parse_args()
  os.makedirs(a.asts, exist_ok=True)
  for name, row in load_rows(a.export, None).items():
    for k, kern in enumerate(row.kernels): kernopt.save(kern.ast, ast_path(name, k, a.asts))
    print(f"{name}: {len(row.kernels)} kernel(s) -> {os.path.relpath(ast_path(name, 0, a.asts))} ...")

if __name__ == "__main__":
  main()
