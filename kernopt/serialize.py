"""The canonical serialization of a kernel AST: JSON data (`ast_to_json`, `ast_from_json`), its text and digest
(`ast_dumps`, `ast_digest`: the same in every process), tagged values (`value_to_json`), and AST files (`save_ast`,
`load_ast`). Imports dtype, errors, shape/, lazyop and verify."""
from __future__ import annotations
import hashlib
import json
import math
import os
import stat
from dataclasses import fields
from enum import Enum
from typing import Any, Union
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.errors import VerifyError
from kernopt.lazyop import (BinaryOps, BufferOps, ConstBuffer, KernelInfo, LazyOp, MemBuffer, MetaOps, Op, ReduceOps,
                            TernaryOps, UnaryOps, WMMAArg)
from kernopt.shape import symbolic
from kernopt.shape.shapetracker import ShapeTracker
from kernopt.shape.view import View
from kernopt.verify import verify_lazyop

# ***** canonical serialization *****

AST_FORMAT_VERSION = 1
_ENUMS: dict[str, type[Op]] = {e.__name__: e for e in
                                 (UnaryOps, BinaryOps, TernaryOps, ReduceOps, BufferOps, MetaOps)}
_Record = Union[MemBuffer, ConstBuffer, KernelInfo, WMMAArg]
_RECORDS: dict[str, type[_Record]] = {c.__name__: c for c in (MemBuffer, ConstBuffer, KernelInfo, WMMAArg)}
_SYM_BIN = ("MulNode", "DivNode", "ModNode", "LtNode")
_SYM_LIST = ("SumNode", "AndNode")

def _enc_node(n: symbolic.Node) -> dict[str, Any]:
  name = type(n).__name__
  if isinstance(n, symbolic.NumNode): return {"t": name, "b": n.b}
  if isinstance(n, symbolic.Variable): return {"t": name, "expr": n.expr, "min": n.min, "max": n.max, "val": n.val}
  if isinstance(n, (symbolic.MulNode, symbolic.DivNode, symbolic.ModNode, symbolic.LtNode)):
    return {"t": name, "a": _enc(n.a), "b": _enc(n.b)}
  if isinstance(n, (symbolic.SumNode, symbolic.AndNode)): return {"t": name, "nodes": [_enc(x) for x in n.nodes]}
  raise VerifyError(f"cannot serialize symbolic node {name}")

def _enc_dtype(dt: DType) -> dict[str, Any]:
  if isinstance(dt, ImageDType): return {"t": "image", "name": dt.name, "shape": list(dt.shape)}
  return {"t": "dtype", "name": dt.scalar().name, "count": dt.count}

def _enc(x: Any) -> Any:
  if x is None or isinstance(x, (bool, str)): return x
  if isinstance(x, int): return int(x)
  if isinstance(x, float): return x if math.isfinite(x) else {"t": "float", "v": repr(x)}
  if isinstance(x, tuple): return {"t": "tuple", "v": [_enc(y) for y in x]}
  if isinstance(x, DType): return _enc_dtype(x)
  if isinstance(x, symbolic.Node): return _enc_node(x)
  if isinstance(x, Enum) and type(x).__name__ in _ENUMS: return {"t": "enum", "v": f"{type(x).__name__}.{x.name}"}
  if isinstance(x, ShapeTracker):
    return {"t": "st", "views": [{"shape": _enc(v.shape), "strides": _enc(v.strides), "offset": _enc(v.offset),
                                  "mask": _enc(v.mask)} for v in x.views]}
  if type(x).__name__ in _RECORDS and isinstance(x, _RECORDS[type(x).__name__]):
    return {"t": type(x).__name__, **{f.name: _enc(getattr(x, f.name)) for f in fields(x)}}
  raise VerifyError(f"cannot serialize a {type(x).__name__} in an AST: {x!r}")

def _dec_node(d: dict[str, Any]) -> symbolic.Node:
  t = d["t"]
  if t == "NumNode": return symbolic.NumNode(d["b"])
  if t == "Variable":
    v = symbolic.Variable(d["expr"], d["min"], d["max"])
    return v if d["val"] is None else v.bind(d["val"])
  if t in _SYM_BIN: return getattr(symbolic, t)(_dec(d["a"]), _dec(d["b"]))
  return getattr(symbolic, t)([_dec(x) for x in d["nodes"]])

def _dec_view(d: dict[str, Any]) -> View:
  shape, strides, offset, mask = _dec(d["shape"]), _dec(d["strides"]), _dec(d["offset"]), _dec(d["mask"])
  v = View.create(shape, strides, offset, mask)
  # View.create's caches can't tell a bound Variable from its unbound self: keep the bound values we were given
  flat = (*shape, *strides, offset, *(b for m in (mask or ()) for b in m))
  if any(u.val is not None for x in flat if isinstance(x, symbolic.Node) for u in x.vars()):
    v = View(shape, strides, offset, mask, v.contiguous)
  return v

def _dec(x: Any) -> Any:
  if not isinstance(x, dict): return x
  t = x["t"]
  if t == "float": return math.nan if x["v"] == "nan" else float(x["v"])  # one nan object keeps equal args equal
  if t == "tuple": return tuple(_dec(y) for y in x["v"])
  if t == "dtype":
    dt = dtypes.from_name(x["name"])
    return dt.vec(x["count"]) if x["count"] != 1 else dt
  if t == "image": return {"imagef": dtypes.imagef, "imageh": dtypes.imageh}[x["name"]](tuple(x["shape"]))
  if t in ("NumNode", "Variable") or t in _SYM_BIN or t in _SYM_LIST: return _dec_node(x)
  if t == "enum":
    cls, name = x["v"].split(".")
    return _ENUMS[cls][name]
  if t == "st": return ShapeTracker(tuple(_dec_view(v) for v in x["views"]))
  if t in _RECORDS: return _RECORDS[t](**{k: _dec(v) for k, v in x.items() if k != "t"})
  raise VerifyError(f"unknown tag {t!r} in a serialized AST")

def ast_to_json(ast: LazyOp) -> dict[str, Any]:
  """A JSON-compatible dict for `ast`: {"version": 1, "nodes": [...], "root": i}. Each distinct op is one entry of
  `nodes` (children before parents, sources by index), so shared sub-trees are stored once. Non-JSON values are
  tagged dicts {"t": kind, ...}: tuples, non-finite floats, dtypes, ShapeTrackers (views with shape, strides, offset,
  mask), symbolic nodes (by structure), enums and the arg records."""
  index: dict[LazyOp, int] = {}
  nodes: list[dict[str, Any]] = []
  for op in ast.lazyops:
    index[op] = len(nodes)
    nodes.append({"op": f"{type(op.op).__name__}.{op.op.name}", "src": [index[s] for s in op.src], "arg": _enc(op.arg)})
  return {"version": AST_FORMAT_VERSION, "nodes": nodes, "root": len(nodes) - 1}

def ast_from_json(d: dict[str, Any]) -> LazyOp:
  """The LazyOp that ast_to_json turned into `d`. Raises VerifyError on an unknown version or a malformed dict."""
  if not isinstance(d, dict) or d.get("version") != AST_FORMAT_VERSION:
    raise VerifyError(f"unsupported serialized AST version {d.get('version') if isinstance(d, dict) else d!r}, "
                      f"expected {AST_FORMAT_VERSION}")
  try:
    built: list[LazyOp] = []
    for i, n in enumerate(d["nodes"]):
      if any(not isinstance(s, int) or not 0 <= s < i for s in n["src"]):
        raise VerifyError(f"node {i} has bad sources {n['src']}")
      cls, name = n["op"].split(".")
      built.append(LazyOp(_ENUMS[cls][name], tuple(built[s] for s in n["src"]), _dec(n["arg"])))
    return built[d["root"]]
  except VerifyError: raise
  except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
    raise VerifyError(f"malformed serialized AST: {type(e).__name__}: {e}") from e

def ast_dumps(ast: LazyOp) -> str:
  """The canonical JSON text of `ast` (sorted keys, no whitespace)."""
  return json.dumps(ast_to_json(ast), sort_keys=True, separators=(",", ":"), allow_nan=False)

def ast_digest(ast: LazyOp) -> str:
  """sha256 hex digest of ast_dumps(ast): the same in every process and Python version with the same format version."""
  return hashlib.sha256(ast_dumps(ast).encode()).hexdigest()

def value_to_json(x: Any) -> Any:
  """x (ints, floats, strings, tuples, dtypes, symbolic nodes, ShapeTrackers, enums, arg records) as tagged JSON data,
  as ast_to_json stores an op's arg."""
  return _enc(x)

def value_from_json(d: Any) -> Any:
  """The value value_to_json turned into d."""
  return _dec(d)

# ***** AST files: the canonical JSON of ops.ast_dumps, one kernel per file *****

def save_ast(ast: LazyOp, path: Union[str, os.PathLike]) -> str:
  """Write `ast` to `path` as its canonical JSON (written whole or not at all). A directory as `path` names the
  file `<digest>.json` inside it. Returns the path written."""
  if not isinstance(ast, LazyOp): raise VerifyError(f"save takes a LazyOp, got {type(ast).__name__}")
  path = os.fspath(path)
  if os.path.isdir(path): path = os.path.join(path, f"{ast_digest(ast)}.json")
  tmp = f"{path}.{os.getpid()}.tmp"
  with open(tmp, "w", encoding="utf-8") as f: f.write(ast_dumps(ast))
  os.replace(tmp, path)
  return path

MAX_AST_FILE_BYTES = 1 << 28   # load_ast reads no more (a /dev/zero or a runaway file is refused, not read)

def load_ast(path: Union[str, os.PathLike]) -> LazyOp:
  """The AST `save_ast` wrote to `path`, verified. A file that is not a serialized AST (not a regular file, over
  MAX_AST_FILE_BYTES, nested past what the decoder follows) raises VerifyError naming it."""
  where = os.fspath(path)
  try:
    with open(path, "rb") as f:
      if not stat.S_ISREG(os.fstat(f.fileno()).st_mode): raise VerifyError(f"{where!r} is not a regular file")
      raw = f.read(MAX_AST_FILE_BYTES + 1)
    if len(raw) > MAX_AST_FILE_BYTES: raise VerifyError(f"{where!r} is over {MAX_AST_FILE_BYTES} bytes")
    d = json.loads(raw.decode("utf-8"))
  except (OSError, UnicodeDecodeError, ValueError) as e:
    raise VerifyError(f"cannot read an AST from {where!r}: {e}") from e
  except RecursionError:
    raise VerifyError(f"cannot read an AST from {where!r}: nested too deeply") from None
  try: ast = ast_from_json(d)
  except VerifyError as e: raise VerifyError(f"{where!r}: {e}") from e
  except RecursionError: raise VerifyError(f"{where!r}: nested too deeply") from None
  verify_lazyop(ast)
  return ast

def save_if_asked(ast: LazyOp, directory: str) -> None:
  """SAVE_ASTS=dir: every AST a Kernel is built from lands in `directory` once, as `<digest>.json`."""
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, f"{ast_digest(ast)}.json")
  if not os.path.exists(path): save_ast(ast, path)
