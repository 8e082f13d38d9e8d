"""The persistent program cache: a rendered `Program` (source, signature, launch sizes, estimates) on disk, keyed by
everything that decides it, so a warm process goes from AST to runner without lowering or rendering. Entries are
JSON in the private disk cache (helpers.py), each carrying the sha256 of its own text (checked on read); the table
keeps the MAX_ENTRIES most recently used (to the day). Imports helpers, ops, renderers."""
from __future__ import annotations
import hashlib
import json
import time
from typing import Any, Optional
from kernopt.helpers import Config, count, diskcache_get, diskcache_put, diskcache_trim, getconfig, source_digest
from kernopt.ops import LazyOp, ast_digest, value_from_json, value_to_json
from kernopt.renderers import BufferArg, Program, Renderer, VarArg

PROGRAM_FORMAT = 2
MAX_ENTRIES = 4096
TABLE = "program_cache"
# knobs that change what the optimizer chooses or the lowerer emits (DEBUG, caches and device choice do not)
CODEGEN_KNOBS = ("USE_TC", "TC_OPT", "MV", "MV_BLOCKSIZE", "MV_THREADS_PER_ROW", "MV_ROWS_PER_THREAD", "NOLOCALS",
                 "CPU_MARCH", "CPU_THREADS")

def program_key(ast: LazyOp, renderer: Renderer, mode: str, cfg: Optional[Config] = None) -> str:
  """The cache key of the Program that `mode` ("protocol", or "beam<N>" for a search) makes of ast for renderer: the
  AST's digest, the renderer's class and full capabilities, the codegen knobs, the format and kernopt's own source."""
  cfg = cfg or getconfig()
  parts = {"ast": ast_digest(ast), "mode": mode, "renderer": f"{type(renderer).__module__}.{type(renderer).__name__}",
           "caps": renderer.capabilities(), "knobs": {k: getattr(cfg, k) for k in CODEGEN_KNOBS},
           "format": PROGRAM_FORMAT, "kernopt": source_digest()}
  return hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr).encode()).hexdigest()

def program_to_json(p: Program) -> dict[str, Any]:
  """Program p as JSON data, without its UOps (a runtime that interprets them does not use this cache)."""
  return {"name": p.name, "src": p.src, "device": p.device, "global_size": value_to_json(p.global_size),
          "local_size": value_to_json(p.local_size), "op_estimate": value_to_json(p.op_estimate),
          "mem_estimate": value_to_json(p.mem_estimate),
          "args": [[a.idx, value_to_json(a.dtype), value_to_json(a.min_size), a.writable, a.used, value_to_json(a.lo),
                    value_to_json(a.hi)] for a in p.args],
          "vars": [value_to_json(v) for v in p.vars],
          "var_args": [[a.name, value_to_json(a.dtype)] for a in p.var_args],
          "display_name": p.extra.get("display_name", p.name), "opts": list(p.extra.get("opts", ()))}

def program_from_json(d: dict[str, Any]) -> Program:
  args = tuple(BufferArg(i, value_from_json(dt), value_from_json(ms), bool(w), bool(u), value_from_json(lo),
                         value_from_json(hi)) for i, dt, ms, w, u, lo, hi in d["args"])
  return Program(d["name"], d["src"], d["device"], value_from_json(d["global_size"]), value_from_json(d["local_size"]),
                 None, value_from_json(d["op_estimate"]), value_from_json(d["mem_estimate"]), args,
                 tuple(value_from_json(v) for v in d["vars"]),
                 {"display_name": d["display_name"], "opts": tuple(str(o) for o in d.get("opts", ()))},
                 tuple(VarArg(n, value_from_json(dt)) for n, dt in d["var_args"]))

def _today() -> int: return int(time.time() // 86400)

def get(key: str) -> Optional[Program]:
  """The Program stored under key, or None (a miss, a corrupt entry or a cache that is off). A hit on an entry last
  used before today is written back, so it counts as recently used (least-recently-used to the day, without a write
  per hit: a write costs milliseconds, a read a fraction of one)."""
  entry = diskcache_get(TABLE, key)
  try:
    text = entry["program"]
    if not isinstance(text, str) or hashlib.sha256(text.encode()).hexdigest() != entry["sha256"]: raise ValueError
    prg = program_from_json(json.loads(text))
  except Exception:   # anything but an entry we wrote (missing, truncated, planted) is a miss
    count("program_cache_misses")
    return None
  count("program_cache_hits")
  if entry.get("used") != _today(): diskcache_put(TABLE, key, {**entry, "used": _today()})
  return prg

def put(key: str, program: Program) -> None:
  text = json.dumps(program_to_json(program), sort_keys=True)
  entry = {"program": text, "sha256": hashlib.sha256(text.encode()).hexdigest(), "used": _today()}
  diskcache_put(TABLE, key, entry)
  diskcache_trim(TABLE, MAX_ENTRIES)
