"""Generative fuzz: random kernel ASTs (every ALU op and dtype, casts and bitcasts, broadcasts, permutes, flips,
reshapes, pads and shrinks, masked and fully masked loads and consts, SUM/MAX reduces over random axes, several outputs,
symbolic dimensions) run on every device present with no opts, the standard protocol and random Opts, each result
compared with tests/ast_oracle.py's independent numpy evaluation (exact for ints, bools and floats computed exactly,
a dtype tolerance scaled by the largest intermediate otherwise). Kernels run in a persistent worker process that is
restarted after a crash, so a crash is a reported failure. A failure is shrunk and saved under tests/regressions/
(replayed by test_regressions). FUZZ_AST_N (ASTs in all, default 32 over 4 seeds), FUZZ_AST_MAX_S
(a time limit per test), FUZZ_AST_SEED (default 0), FUZZ_AST_START (the first case index of each chunk, default 0: runs
with the same seed and disjoint [START, START+N/4) ranges add up to one longer run),
FUZZ_AST_STATS (a folder: each test writes its counters there as JSON) scale it; `-s` prints the coverage tables."""
from __future__ import annotations
import json
import math
import os
import pickle
import random
import select
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
for _p in (_HERE, _ROOT):
  if _p not in sys.path: sys.path.insert(0, _p)   # the worker runs this file as a script

import numpy as np  # noqa: E402
import ast_oracle as orc  # noqa: E402
from kernopt.dtype import DType, dtypes  # noqa: E402
from kernopt.errors import KernelOptError, KernoptError, ShapeError, UnsupportedError  # noqa: E402
from kernopt.ops import (BinaryOps, BufferOps, ConstBuffer, LazyOp, MemBuffer, MetaOps, ReduceOps,  # noqa: E402
                         TernaryOps, UnaryOps, ast_from_json, ast_to_json, verify_lazyop)
from kernopt.shape.shapetracker import ShapeTracker  # noqa: E402
from kernopt.shape.symbolic import NumNode, Variable  # noqa: E402
from kernopt.shape.view import View  # noqa: E402

FUZZ_AST_N = int(os.environ.get("FUZZ_AST_N", "32"))
FUZZ_AST_MAX_S = float(os.environ.get("FUZZ_AST_MAX_S", "0")) or None   # stop each test after this long
FUZZ_AST_SEED = int(os.environ.get("FUZZ_AST_SEED", "0"))
FUZZ_AST_START = int(os.environ.get("FUZZ_AST_START", "0"))
CHUNKS = 4
REGRESSIONS = os.path.join(_HERE, "regressions")
SENTINEL_BYTE = 0x7B
REQUEST_TIMEOUT_S = 120.0
WORKER_CASES = 1000
MAX_UPCAST_PRODUCT = 64   # random Opts past this many upcasted elements are legal but slow to compile

# ***** the generator *****

F32, F16, BF16, F64, BOOL = dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.float64, dtypes.bool
INTS = (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
        dtypes.uint64)
FLOATS = (F16, BF16, F32, F64)
DTYPE_WEIGHTS = {F32: 4, dtypes.int32: 3, BOOL: 2, F16: 1.5, dtypes.uint8: 1, dtypes.int64: 1, dtypes.int8: 0.7,
                 dtypes.int16: 0.5, dtypes.uint16: 0.5, dtypes.uint32: 0.7, dtypes.uint64: 0.5, F64: 0.7, BF16: 0.7}
MAG = {F16: 1000.0, BF16: 1000.0, F32: 1e4, F64: 1e4}   # floats are kept below this magnitude
TEMP_IDX = 1 << 20   # inputs are numbered from here while generating, then renumbered after the outputs
DIMS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 32)

def _fits(m: float, gran: int, dt: DType) -> bool:
  """Multiples of 2**-gran up to magnitude m are exact in dt."""
  return m <= MAG[dt] and m * 2.0 ** gran <= 2.0 ** orc._MANT[dt]

@dataclass
class V:
  """A generated value: its op, dtype, an interval holding every element, whether every device computes it exactly
  (floats: dyadic with granularity 2**-gran, exact at every step), and `wild` (float bits
  from a BITCAST: stored only)."""
  op: LazyOp
  dt: DType
  lo: float
  hi: float
  exact: bool = True
  gran: int = 0
  wild: bool = False
  @property
  def mag(self) -> float: return max(abs(self.lo), abs(self.hi))

@dataclass
class InBuf:
  dtype: DType
  kind: str
  views: list = field(default_factory=list)

@dataclass
class Case:
  """One generated AST with what it needs to run: buffer sizes, inputs, var_vals, and tags for the coverage table."""
  ast: LazyOp
  sizes: dict[int, int]
  dtypes: dict[int, DType]
  outputs: list[int]
  inputs: dict[int, np.ndarray]
  var_vals: list[dict[str, int]]
  tols: dict[int, float]          # output idx -> rtol (0: exact)
  wild: set[int]                  # outputs holding float bit patterns: compared bitwise
  tags: Counter = field(default_factory=Counter)
  seed: int = 0

class Gen:
  """Builds one random valid AST. Shapes: the full shape `S` (one dimension may be a Variable), the reduced axes `R`
  and the output shape `O`; `pre` values have shape S, `post` values shape O (after the reduces)."""
  def __init__(self, rng: random.Random):
    self.r, self.tags = rng, Counter()
    self.bufs: dict[int, InBuf] = {}
    self.pool: dict[tuple, list[V]] = {}
    self.vars: list[Variable] = []
    self._shapes()

  # -- shapes --
  def _shapes(self) -> None:
    r = self.r
    self.mm = r.random() < 0.08   # a matmul the tensor cores may take
    if self.mm:
      self.S = self.S_max = tuple(r.choice((8, 16, 24, 32)) for _ in range(3))
      self.R, self.O, self.K = (2,), self.S[:2] + (1,), self.S[2]
      self.tags["matmul"] += 1
      return
    while True:
      rank = r.choice((1, 2, 2, 3, 3, 4))
      S = [r.choice(DIMS) for _ in range(rank)]
      if math.prod(S) <= 1024 and (math.prod(S) >= 2 or r.random() < 0.2): break
    self.S_max = tuple(S)
    self.R = tuple(a for a in range(rank) if r.random() < 0.4) if r.random() < 0.45 else ()
    if len(self.R) == 1 and rank > 1 and r.random() < 0.4:   # two reduce axes: room for nested reduces
      self.R = tuple(sorted(self.R + (r.choice([a for a in range(rank) if a not in self.R]),)))
    if r.random() < 0.15:
      cand = [a for a in range(rank) if S[a] >= 2]
      for name in ("n", "m")[:1 + (r.random() < 0.2)]:
        if not cand: break
        a = cand.pop(r.randrange(len(cand)))
        v = Variable(name, 1, S[a])
        self.vars.append(v)
        S[a] = v
    self.S = tuple(S)
    self.O = tuple(1 if i in self.R else s for i, s in enumerate(self.S))
    self.K = math.prod(self.S_max[a] for a in self.R) if self.R else 1
    if self.R: self.tags["reduce axes " + str(len(self.R))] += 1
    if self.vars: self.tags["symbolic"] += 1

  def shape(self, phase: Any) -> tuple:
    if phase == "pre": return self.S
    if phase == "post": return self.O
    return tuple(1 if a in self.R and a not in phase else s for a, s in enumerate(self.S))
  # a phase between "pre" and "post" is the sorted tuple of the reduce axes still live (not yet reduced) there
  def live(self, phase: Any) -> tuple: return self.R if phase == "pre" else () if phase == "post" else phase
  def phase_of(self, live: tuple) -> Any: return "pre" if live == self.R else "post" if not live else live
  def _int_axes(self, T: tuple) -> list[int]: return [a for a, s in enumerate(T) if isinstance(s, int)]

  # -- views --
  def chain(self, T: tuple, steps: int) -> ShapeTracker:
    """A ShapeTracker of shape T built by `steps` random movement ops (backwards from T)."""
    r = self.r
    if steps <= 0: return ShapeTracker.from_shape(T)
    kind = r.choice(("expand", "permute", "pad", "pad", "shrink", "shrink", "flip", "reshape"))
    ia = self._int_axes(T)
    if kind == "expand":
      axes = [a for a in range(len(T)) if not (isinstance(T[a], int) and T[a] == 1) and r.random() < 0.5]
      if not axes: return self.chain(T, steps - 1)
      self.tags["view broadcast"] += 1
      return self.chain(tuple(1 if a in axes else s for a, s in enumerate(T)), steps - 1).expand(T)
    if kind == "permute" and len(T) > 1:
      p = list(range(len(T)))
      r.shuffle(p)
      inv = [p.index(i) for i in range(len(T))]
      self.tags["view permute"] += 1
      return self.chain(tuple(T[inv[j]] for j in range(len(T))), steps - 1).permute(tuple(p))
    if kind == "pad" and ia:
      pads = [(0, 0)] * len(T)
      for a in ia:
        if T[a] >= 2 and r.random() < 0.6:
          b = r.randint(0, T[a] - 1)
          pads[a] = (b, r.randint(0, T[a] - 1 - b))
      if all(p == (0, 0) for p in pads): return self.chain(T, steps - 1)
      self.tags["view pad"] += 1
      inner = tuple(s - p[0] - p[1] if isinstance(s, int) else s for s, p in zip(T, pads))
      return self.chain(inner, steps - 1).pad(tuple(pads))
    if kind == "shrink" and ia:
      extra = [(r.randint(0, 3), r.randint(0, 3)) if a in ia and r.random() < 0.6 else (0, 0) for a in range(len(T))]
      if all(e == (0, 0) for e in extra): return self.chain(T, steps - 1)
      self.tags["view shrink"] += 1
      outer = tuple(s + e[0] + e[1] if isinstance(s, int) else s for s, e in zip(T, extra))
      return self.chain(outer, steps - 1).shrink(tuple((e[0], e[0] + s) for s, e in zip(T, extra)))
    if kind == "flip" and ia:
      mul = tuple(-1 if a in ia and r.random() < 0.5 else 1 for a in range(len(T)))
      if all(m == 1 for m in mul): return self.chain(T, steps - 1)
      self.tags["view flip"] += 1
      return self.chain(T, steps - 1).stride(mul)
    if kind == "reshape" and len(ia) == len(T) and math.prod(T) > 1:
      other = self._factor(math.prod(T))
      if other == tuple(T): return self.chain(T, steps - 1)
      try: st = self.chain(other, steps - 1).reshape(T)
      except ShapeError: return self.chain(T, steps - 1)
      self.tags["view reshape" + (" (multi-view)" if len(st.views) > 1 else "")] += 1
      return st
    return self.chain(T, steps - 1)

  def _factor(self, n: int) -> tuple[int, ...]:
    fs, d = [], 2
    while n > 1:
      while n % d == 0: fs.append(d); n //= d
      d += 1
    self.r.shuffle(fs)
    out: list[int] = []
    for f in fs:
      if out and self.r.random() < 0.5: out[-1] *= f
      else: out.append(f)
    return tuple(out)

  def dead_view(self, T: tuple) -> Optional[ShapeTracker]:
    """A view of shape T that lies wholly in padding: pad one axis by its own length, then shrink onto the pad."""
    ia = [a for a in self._int_axes(T)]
    if not ia: return None
    a = self.r.choice(ia)
    b = self.r.randint(1, 4)
    base = tuple(b if i == a else s for i, s in enumerate(T))
    before = self.r.random() < 0.5
    pads = tuple(((T[a], 0) if before else (0, T[a])) if i == a else (0, 0) for i in range(len(T)))
    bounds = tuple(((0, T[a]) if before else (b, b + T[a])) if i == a else (0, s) for i, s in enumerate(T))
    self.tags["fully masked load"] += 1
    return self.chain(base, self.r.randint(0, 1)).pad(pads).shrink(bounds)

  # -- leaves --
  def _data_interval(self, dt: DType, kind: str) -> tuple[float, float, bool, int]:
    if dt == BOOL: return 0, 1, True, 0
    if dt in FLOATS:
      return {"q": (-2.0, 2.0, True, 2), "qpos": (0.25, 4.0, True, 2), "u": (-2.0, 2.0, False, 0),
              "upos": (0.5, 4.0, False, 0)}[kind]
    lo, hi = orc.int_range(dt)
    if kind == "small": return (max(lo, -8), 8, True, 0)
    return lo, hi, True, 0

  def matmul(self) -> V:
    """SUM over K of MUL(A (M, K) broadcast over N, B (K, N) broadcast over M), CAST to the accumulator type."""
    M, N, K = self.S
    din, dacc = self.r.choice(((F16, F32), (F16, F32), (F16, F16), (BF16, F32), (F32, F32)))
    a = self._load_st(din, "q", ShapeTracker.from_shape((M, 1, K)).expand((M, N, K)))
    b = self._load_st(din, "q", ShapeTracker.from_shape((K, N)).permute((1, 0)).reshape((1, N, K)).expand((M, N, K)))
    x = self._arith(BinaryOps.MUL, din, [a, b])
    if dacc != din: x = V(LazyOp(UnaryOps.CAST, (x.op,), dacc), dacc, x.lo, x.hi, x.exact, x.gran)
    node = LazyOp(ReduceOps.SUM, (x.op,), (2,))
    m = x.mag * K
    return V(node, dacc, -m, m, x.exact and _fits(m, x.gran, dacc), x.gran)

  def _load_st(self, dt: DType, kind: str, st: ShapeTracker) -> V:
    idx = TEMP_IDX + len(self.bufs)
    self.bufs[idx] = InBuf(dt, kind, [st])
    lo, hi, exact, gran = self._data_interval(dt, kind)
    return V(LazyOp(BufferOps.LOAD, (), MemBuffer(idx, dt, st)), dt, lo, hi, exact, gran)

  def load(self, dt: DType, phase: str, kind: Optional[str] = None) -> V:
    r, T = self.r, self.shape(phase)
    reuse = [i for i, b in self.bufs.items() if b.dtype == dt and (kind is None or b.kind == kind)]
    if reuse and r.random() < 0.3: idx = r.choice(reuse)
    else:
      idx = TEMP_IDX + len(self.bufs)   # renumbered once the outputs are known
      if kind is None:
        kind = r.choice(("q", "q", "qpos", "u", "upos")) if dt in FLOATS else \
          r.choice(("small", "full")) if dt != BOOL else "bool"
      self.bufs[idx] = InBuf(dt, kind)
    buf = self.bufs[idx]
    st = self.dead_view(T) if r.random() < 0.06 else None
    if st is None:
      for _ in range(5):
        try:
          st = self.chain(T, r.choice((0, 0, 1, 1, 2, 3)))
          break
        except ShapeError: continue
      else: st = ShapeTracker.from_shape(T)
    buf.views.append(st)
    lo, hi, exact, gran = self._data_interval(dt, buf.kind)
    if any(v.mask is not None for v in st.views): lo, hi = min(lo, 0), max(hi, 0)
    self.tags["load"] += 1
    return V(LazyOp(BufferOps.LOAD, (), MemBuffer(idx, dt, st)), dt, lo, hi, exact, gran)

  def const(self, dt: DType, phase: str, val: Any = None, masked: bool = True) -> V:
    """A CONST of dt (val, else a random one); `masked`: it may carry a mask (0 outside a random box)."""
    r, T = self.r, self.shape(phase)
    if val is None and self.vars and dt != BOOL and r.random() < 0.3: return self._symbolic_const(dt, T)
    if val is None:
      if dt == BOOL: val = r.random() < 0.5
      elif dt in FLOATS: val = r.choice((0.0, 1.0, -1.0, 0.5, 2.0, -0.25, 1.75, 3.0))
      else:
        lo, hi = orc.int_range(dt)
        val = r.choice((0, 1, 2, 3, 7, -1, -5, lo, hi, hi - 1, orc.bits(dt) - 1, orc.bits(dt)))
        if not lo <= val <= hi: val = 1
    mask = None
    ia = self._int_axes(T)
    if ia and r.random() < 0.12:
      mask = tuple((0, s) if not isinstance(s, int) else (lambda b: (b, r.randint(b, s)))(r.randint(0, s))
                   for s in T)
      if masked: self.tags["masked const"] += 1
      else: mask = None   # drawn all the same: the cases after it stay what they were
    st = ShapeTracker((View.create(T, (0,) * len(T), 0, mask),))
    v = val if dt in FLOATS else (bool(val) if dt == BOOL else int(val))
    lo = hi = float(v) if dt in FLOATS else int(v)
    if mask is not None: lo, hi = min(lo, 0), max(hi, 0)
    self.tags["const"] += 1
    return V(LazyOp(BufferOps.CONST, (), ConstBuffer(float(v) if dt in FLOATS else v, dt, st)), dt, lo, hi, True,
             2 if dt in FLOATS else 0)

  def _symbolic_const(self, dt: DType, T: tuple) -> V:
    """A CONST holding an int expression of the kernel's Variables (all small and >= 1: it fits every dtype)."""
    r = self.r
    v, w = r.choice(self.vars), r.choice(self.vars)
    node = r.choice((v, v, v * 2 + 1, v // 2, (v + 3) // 4, v % 3, v + w, v * w // 16))
    if isinstance(node, int): node = NumNode(node)
    if dt in INTS and node.max > orc.int_range(dt)[1]: node = v
    st = ShapeTracker((View.create(T, (0,) * len(T)),))
    self.tags["symbolic const"] += 1
    return V(LazyOp(BufferOps.CONST, (), ConstBuffer(node, dt, st)), dt, node.min, node.max, True, 0)

  # -- interior --
  def gen(self, dt: DType, phase: str, depth: int, exact: bool = False, top: bool = False,
          force_reduce: bool = False) -> V:
    """A value of dtype dt (`exact`: computed exactly on every device; `top`: stored directly)."""
    r = self.r
    for _ in range(12):
      if not force_reduce and (depth <= 0 or r.random() < 0.22):
        key = (dt, phase)
        if self.pool.get(key) and r.random() < 0.15:
          c = r.choice(self.pool[key])
          if c.exact or not exact: return c
        v = self.load(dt, phase) if r.random() < 0.75 else self.const(dt, phase)
        if v.exact or not exact: return v
        continue
      try: v = self._interior(dt, phase, depth, exact, top, force_reduce)
      except _Retry: continue
      if v is None or (exact and not v.exact): continue
      if dt in FLOATS and not v.wild and v.mag > MAG[dt]: continue
      self.pool.setdefault((dt, phase), []).append(v)
      return v
    if force_reduce: return self._reduce(dt, depth, exact, phase)
    return self.const(dt, phase)

  def _interior(self, dt: DType, phase: str, depth: int, exact: bool, top: bool, force: bool) -> Optional[V]:
    r = self.r
    post_reduce = self.live(phase) != self.R
    kinds = ["unary", "binary", "binary", "binary", "where", "cast", "cast"]
    if dt == BOOL: kinds += ["cmp", "cmp", "cmp"]
    if dt != BOOL and dt not in (F16, BF16): kinds.append("mulacc")
    if dt != BOOL: kinds.append("bitcast")
    if post_reduce: kinds += ["reduce"] * (6 if force else 2)
    if top: kinds.append("dead")
    kind = r.choice(kinds)
    d = depth - 1
    if kind == "reduce": return self._reduce(dt, d, exact, phase)
    if kind == "dead": return self._dead(dt, phase, d, force)
    if kind == "unary": return self._unary(dt, phase, d, exact, force)
    if kind == "binary": return self._binary(dt, phase, d, exact, force)
    if kind == "cmp": return self._cmp(phase, d, force)
    if kind == "where": return self._where(dt, phase, d, exact, force)
    if kind == "mulacc":
      a, b, c = (self.gen(dt, phase, d, exact, force_reduce=force and i == 0) for i in range(3))
      return self._arith(TernaryOps.MULACC, dt, [a, b, c])
    if kind == "cast": return self._cast(dt, phase, d, exact, top, force)
    return self._bitcast(dt, phase, d, exact, top, force)

  def _reduce(self, dt: DType, depth: int, exact: bool, phase: Any = "post") -> V:
    """A reduce whose result is at `phase`: over every reduce axis not live there, or (nested: its input holds
    another reduce) over some of them, from an input where the others are still live."""
    r = self.r
    out = self.live(phase)
    missing = [a for a in self.R if a not in out]
    axes = tuple(missing)
    if len(missing) > 1 and r.random() < 0.6: axes = tuple(sorted(r.sample(missing, r.randint(1, len(missing) - 1))))
    op = ReduceOps.MAX if dt == BOOL or r.random() < 0.35 else ReduceOps.SUM
    src = self.phase_of(tuple(sorted(set(out) | set(axes))))
    x = self.gen(dt, src, depth, exact, force_reduce=src != "pre" and r.random() < 0.6)
    if x.wild: raise _Retry()
    node = LazyOp(op, (x.op,), axes)
    self.tags[f"reduce {op.name}"] += 1
    if op is ReduceOps.MAX: return V(node, dt, x.lo, x.hi, x.exact, x.gran)
    k = math.prod(self.S_max[a] for a in axes)
    lo, hi = x.lo * k, x.hi * k
    lo, hi = min(lo, x.lo), max(hi, x.hi)
    if dt in FLOATS:
      if max(abs(lo), abs(hi)) > MAG[dt]: raise _Retry()
      return V(node, dt, lo, hi, x.exact and _fits(max(abs(lo), abs(hi)), x.gran, dt), x.gran)
    return V(node, dt, *_clamp(lo, hi, dt))

  def _dead(self, dt: DType, phase: str, depth: int, force: bool) -> V:
    """Patterns whose loads fold away: WHERE on a constant condition, x*0 on ints, x AND 0."""
    r = self.r
    x = self.gen(dt, phase, depth, force_reduce=force)
    y = self.gen(dt, phase, depth)
    self.tags["dead pattern"] += 1
    if dt in INTS and r.random() < 0.5:
      op = r.choice((BinaryOps.MUL, BinaryOps.AND))
      z = self.const(dt, phase, 0)
      node = LazyOp(op, (y.op, z.op)) if r.random() < 0.5 else LazyOp(op, (z.op, y.op))
      return self._arith(BinaryOps.ADD, dt, [x, V(node, dt, 0, 0)])
    c = r.random() < 0.5
    cond = self.const(BOOL, phase, c, masked=False)   # a masked condition would be False outside its box
    srcs = (cond.op, x.op, y.op) if c else (cond.op, y.op, x.op)
    return V(LazyOp(TernaryOps.WHERE, srcs), dt, x.lo, x.hi, x.exact, x.gran, x.wild)

  def _unary(self, dt: DType, phase: str, depth: int, exact: bool, force: bool) -> V:
    r = self.r
    if dt == BOOL: ops = [UnaryOps.NEG]
    elif dt in INTS: ops = [UnaryOps.NEG, UnaryOps.NEG, UnaryOps.RECIP]
    else: ops = [UnaryOps.NEG, UnaryOps.NEG] + ([] if exact else [UnaryOps.RECIP, UnaryOps.EXP2, UnaryOps.LOG2,
                                                                   UnaryOps.SIN, UnaryOps.SQRT])
    op = r.choice(ops)
    x = self.gen(dt, phase, depth, exact and op is UnaryOps.NEG, force_reduce=force)
    if x.wild: raise _Retry()
    node = LazyOp(op, (x.op,))
    if dt == BOOL: return V(node, dt, 0, 1)
    if dt in INTS:
      if op is UnaryOps.RECIP: return V(node, dt, *_clamp(-1, 1, dt))
      return V(node, dt, *_clamp(-x.hi, -x.lo, dt))
    if op is UnaryOps.NEG: return V(node, dt, -x.hi, -x.lo, x.exact, x.gran)
    small = 4.0 if dt in (F16, BF16) else 8.0
    if op is UnaryOps.RECIP:
      if x.lo >= 0.25 or x.hi <= -0.25: return V(node, dt, 1 / x.hi, 1 / x.lo, False)
    elif op is UnaryOps.EXP2:
      if -20 <= x.lo and x.hi <= small: return V(node, dt, 2.0 ** x.lo, 2.0 ** x.hi, False)
    elif op is UnaryOps.LOG2:
      if x.lo >= 0.25: return V(node, dt, math.log2(x.lo), math.log2(x.hi), False)
    elif op is UnaryOps.SQRT:
      if x.lo >= 0: return V(node, dt, math.sqrt(x.lo), math.sqrt(x.hi), False)
    elif op is UnaryOps.SIN:
      if x.mag <= 100: return V(node, dt, -1.0, 1.0, False)
    raise _Retry()

  def _binary(self, dt: DType, phase: str, depth: int, exact: bool, force: bool) -> V:
    r = self.r
    if dt == BOOL: ops = [BinaryOps.AND, BinaryOps.OR, BinaryOps.XOR, BinaryOps.MAX, BinaryOps.ADD, BinaryOps.MUL]
    elif dt in INTS:
      ops = [BinaryOps.ADD, BinaryOps.ADD, BinaryOps.MUL, BinaryOps.MAX, BinaryOps.IDIV, BinaryOps.MOD, BinaryOps.XOR,
             BinaryOps.AND, BinaryOps.OR, BinaryOps.SHL, BinaryOps.SHR]
    else: ops = [BinaryOps.ADD, BinaryOps.ADD, BinaryOps.MUL, BinaryOps.MAX, BinaryOps.MOD] + \
      ([] if exact else [BinaryOps.IDIV, BinaryOps.IDIV])
    op = r.choice(ops)
    need_exact = exact or (dt in FLOATS and op is BinaryOps.MOD)
    first = r.random() < 0.5
    a = self.gen(dt, phase, depth, need_exact, force_reduce=force and first)
    b = self.gen(dt, phase, depth, need_exact, force_reduce=force and not first)
    if dt in INTS and r.random() < 0.1 and op in (BinaryOps.IDIV, BinaryOps.MOD):
      b = self.const(dt, phase, r.choice((0, orc.int_range(dt)[1] if dtypes.is_unsigned(dt) else -1)))   # by zero
      # gives 0; MIN / -1 wraps
    return self._arith(op, dt, [a, b])

  def _arith(self, op: Any, dt: DType, xs: list[V]) -> V:
    if any(x.wild for x in xs): raise _Retry()
    node = LazyOp(op, tuple(x.op for x in xs))
    if dt == BOOL: return V(node, dt, 0, 1)
    a, b = xs[0], xs[1]
    if op is TernaryOps.MULACC:
      m = self._arith(BinaryOps.MUL, dt, [a, b])
      s = self._arith(BinaryOps.ADD, dt, [m, xs[2]])
      return V(node, dt, s.lo, s.hi, s.exact, s.gran)
    if op is BinaryOps.ADD: lo, hi, g = a.lo + b.lo, a.hi + b.hi, max(a.gran, b.gran)
    elif op is BinaryOps.MUL:
      p = (a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi)
      lo, hi, g = min(p), max(p), a.gran + b.gran
    elif op is BinaryOps.MAX: lo, hi, g = max(a.lo, b.lo), max(a.hi, b.hi), max(a.gran, b.gran)
    elif op is BinaryOps.MOD:
      m = min(a.mag, b.mag)
      lo, hi, g = (0 if a.lo >= 0 else -m), (0 if a.hi <= 0 else m), max(a.gran, b.gran)
    elif op is BinaryOps.IDIV:
      if dt in FLOATS:
        if not (b.lo >= 0.25 or b.hi <= -0.25): raise _Retry()
        q = (a.lo / b.lo, a.lo / b.hi, a.hi / b.lo, a.hi / b.hi)
        return V(node, dt, min(q), max(q), False)
      lo, hi, g = -a.mag, a.mag, 0
    else:   # bitwise and shifts on ints
      lo, hi, g = orc.int_range(dt) + (0,)
      if op is BinaryOps.AND and a.lo >= 0 and b.lo >= 0: lo, hi = 0, min(a.hi, b.hi)
    if dt in FLOATS:
      ex = all(x.exact for x in xs) and _fits(max(abs(lo), abs(hi)), g, dt)
      return V(node, dt, lo, hi, ex, g)
    return V(node, dt, *_clamp(lo, hi, dt))

  def _cmp(self, phase: str, depth: int, force: bool) -> V:
    op = self.r.choice((BinaryOps.CMPLT, BinaryOps.CMPNE))
    sdt = self.r.choices(list(DTYPE_WEIGHTS), list(DTYPE_WEIGHTS.values()))[0]
    a = self.gen(sdt, phase, depth, sdt in FLOATS, force_reduce=force)
    b = self.gen(sdt, phase, depth, sdt in FLOATS)
    if a.wild or b.wild: raise _Retry()
    self.tags[f"cmp on {sdt.name}"] += 1
    return V(LazyOp(op, (a.op, b.op)), BOOL, 0, 1)

  def _where(self, dt: DType, phase: str, depth: int, exact: bool, force: bool) -> V:
    c = self.gen(BOOL, phase, depth, force_reduce=force)
    a, b = self.gen(dt, phase, depth, exact), self.gen(dt, phase, depth, exact)
    if a.wild or b.wild: raise _Retry()
    return V(LazyOp(TernaryOps.WHERE, (c.op, a.op, b.op)), dt, min(a.lo, b.lo), max(a.hi, b.hi),
             a.exact and b.exact, max(a.gran, b.gran))

  def _cast(self, dt: DType, phase: str, depth: int, exact: bool, top: bool, force: bool) -> V:
    r = self.r
    sdt = r.choices(list(DTYPE_WEIGHTS), list(DTYPE_WEIGHTS.values()))[0]
    if sdt == dt: raise _Retry()
    need_exact = exact or (sdt in FLOATS and dt not in FLOATS)
    x = self.gen(sdt, phase, depth, need_exact, force_reduce=force)
    if x.wild: raise _Retry()
    node = LazyOp(UnaryOps.CAST, (x.op,), dt)
    self.tags[f"cast {sdt.name}->{dt.name}"] += 1
    if dt == BOOL: return V(node, dt, 0, 1)
    if dt in FLOATS:
      if sdt in FLOATS: return V(node, dt, x.lo, x.hi, x.exact and _fits(x.mag, x.gran, dt), x.gran)
      if x.mag > MAG[dt] and not top: raise _Retry()
      return V(node, dt, float(x.lo), float(x.hi), x.mag < 2 ** orc._MANT[dt] and x.mag <= MAG[dt], 0)
    lo, hi = orc.int_range(dt)
    if sdt in FLOATS:
      tlo, thi = math.trunc(x.lo), math.trunc(x.hi)
      if tlo < lo or thi > hi:   # some values out of dt's range: those give 0 (x is exact, so every device agrees)
        self.tags["cast float->int out of range"] += 1
        return V(node, dt, min(max(tlo, lo), 0), max(min(thi, hi), 0))
      return V(node, dt, tlo, thi)
    return V(node, dt, *_clamp(x.lo, x.hi, dt))

  def _bitcast(self, dt: DType, phase: str, depth: int, exact: bool, top: bool, force: bool) -> V:
    r = self.r
    same = [d for d in DTYPE_WEIGHTS if d != dt and d != BOOL and d.itemsize == dt.itemsize]
    if not same: raise _Retry()
    sdt = r.choice(same)
    if dt in FLOATS:
      if sdt in FLOATS: raise _Retry()   # half <-> bfloat16 would need exactness in both
      if not top: raise _Retry()
      # finite normal bit patterns, so no device has a NaN payload or a denormal to canonicalize
      x = self.load(sdt, phase, kind=f"fbits:{dt.name}")
      self.tags[f"bitcast {sdt.name}->{dt.name}"] += 1
      return V(LazyOp(UnaryOps.BITCAST, (x.op,), dt), dt, 0, 0, False, 0, wild=True)
    if sdt in FLOATS: x = self.gen(sdt, phase, depth, True, force_reduce=force)
    else: x = self.gen(sdt, phase, depth, force_reduce=force)
    if x.wild: raise _Retry()
    self.tags[f"bitcast {sdt.name}->{dt.name}"] += 1
    return V(LazyOp(UnaryOps.BITCAST, (x.op,), dt), dt, *orc.int_range(dt))

  # -- the kernel --
  def kernel(self) -> tuple[LazyOp, list[tuple[int, V]], dict[int, InBuf]]:
    r = self.r
    n_out = r.choices((1, 2, 3), (70, 20, 10))[0]
    phase = "post" if self.R else "pre"
    roots = []
    for i in range(n_out):
      if self.mm and i == 0:
        v = self.matmul()
        if r.random() < 0.3: v = self._arith(BinaryOps.ADD, v.dt, [v, self.load(v.dt, "post")])
        roots.append(v)
        continue
      dt = r.choices(list(DTYPE_WEIGHTS), list(DTYPE_WEIGHTS.values()))[0]
      roots.append(self.gen(dt, phase, r.randint(1, 5), top=True, force_reduce=bool(self.R) and r.random() < 0.9))
    # outputs are buffers 0..n_out-1, inputs follow in the order they were made
    order = sorted(self.bufs)
    ren = {old: n_out + i for i, old in enumerate(order)}
    stores = []
    for i, v in enumerate(roots):
      stores.append(LazyOp(BufferOps.STORE, (_renumber(v.op, ren),), MemBuffer(i, v.dt, self.store_view())))
    if n_out > 1: self.tags["multi-output"] += 1
    bufs = {ren[k]: b for k, b in self.bufs.items()}
    for b in bufs.values(): b.views = []
    ast = LazyOp(MetaOps.KERNEL, tuple(stores))
    for x in ast.lazyops:
      if x.op is BufferOps.LOAD: bufs[x.arg.idx].views.append(x.arg.st)
    return ast, list(enumerate(roots)), bufs

  def store_view(self) -> ShapeTracker:
    r, O = self.r, self.O
    k = r.random()
    ia = self._int_axes(O)
    if k < 0.12 and len(O) > 1:
      p = list(range(len(O)))
      r.shuffle(p)
      inv = [p.index(i) for i in range(len(O))]
      self.tags["store permuted"] += 1
      return ShapeTracker.from_shape(tuple(O[inv[j]] for j in range(len(O)))).permute(tuple(p))
    if k < 0.22 and ia:
      extra = [(r.randint(0, 2), r.randint(0, 2)) if a in ia else (0, 0) for a in range(len(O))]
      outer = tuple(s + e[0] + e[1] if isinstance(s, int) else s for s, e in zip(O, extra))
      self.tags["store into a window"] += 1
      return ShapeTracker.from_shape(outer).shrink(tuple((e[0], e[0] + s) for s, e in zip(O, extra)))
    if k < 0.28 and ia:
      self.tags["store flipped"] += 1
      return ShapeTracker.from_shape(O).stride(tuple(-1 if a in ia else 1 for a in range(len(O))))
    return ShapeTracker.from_shape(O)

class _Retry(Exception):
  """This choice doesn't fit (a guard of the value model): try another."""

def _clamp(lo: float, hi: float, dt: DType) -> tuple[int, int]:
  """An int interval, or dt's whole range where it may have wrapped."""
  a, b = orc.int_range(dt)
  if lo < a or hi > b: return a, b
  return int(lo), int(hi)

def _renumber(op: LazyOp, ren: dict[int, int]) -> LazyOp:
  memo: dict[LazyOp, LazyOp] = {}
  for x in op.lazyops:
    src = tuple(memo[s] for s in x.src)
    arg = x.arg
    if x.op is BufferOps.LOAD: arg = MemBuffer(ren[arg.idx], arg.dtype, arg.st)
    memo[x] = LazyOp(x.op, src, arg)
  return memo[op]

# ***** inputs, sizes, tolerances *****

def _finite_bits(rng: np.random.Generator, n: int, fdt: DType, idt: DType) -> np.ndarray:
  """Bit patterns (as idt) of finite normal floats of type fdt."""
  if fdt == F64: vals = rng.uniform(-4, 4, n) * 2.0 ** rng.integers(-60, 60, n)
  elif fdt == F32: vals = (rng.uniform(-4, 4, n) * 2.0 ** rng.integers(-30, 30, n)).astype(np.float32)
  else: vals = rng.uniform(-4, 4, n) * 2.0 ** rng.integers(-6, 6, n)
  vals = np.where(np.abs(vals) < 2.0 ** -12, 1.0, vals)
  store = orc.to_storage(np.asarray(vals, dtype=np.float64 if fdt == F64 else np.float32), fdt)
  return store.view(orc.storage_np(idt))

def make_data(rng: np.random.Generator, b: InBuf, n: int) -> np.ndarray:
  dt, kind = b.dtype, b.kind
  if dt == BOOL: return rng.integers(0, 2, n).astype(bool)
  if kind.startswith("fbits:"): return _finite_bits(rng, n, dtypes.from_name(kind[6:]), dt)
  if dt in FLOATS:
    if kind == "q": v = rng.integers(-8, 9, n) * 0.25
    elif kind == "qpos": v = rng.integers(1, 17, n) * 0.25
    elif kind == "u": v = rng.uniform(-2, 2, n)
    else: v = rng.uniform(0.5, 4, n)
    return orc.to_storage(np.asarray(v, dtype=np.float64 if dt == F64 else np.float32), dt)
  lo, hi = orc.int_range(dt)
  if kind == "small": vals = rng.integers(max(lo, -8), 9, n)
  else:
    vals = np.asarray([int(x) for x in rng.integers(0, 1 << 62, n)], dtype=object) % (hi - lo + 1) + lo
    specials = [lo, hi, 0, -1 if lo < 0 else 1, 1, lo + 1, hi - 1]
    for i in range(min(n, len(specials))):
      if rng.random() < 0.5: vals[rng.integers(0, n)] = specials[i]
  return np.asarray([int(x) for x in vals], dtype=object).astype(orc.storage_np(dt))

def _var_vals(rng: random.Random, vars_: list[Variable]) -> list[dict[str, int]]:
  if not vars_: return [{}]
  ret = [{v.expr: rng.randint(v.min, v.max) for v in vars_}, {v.expr: v.max for v in vars_}]
  if rng.random() < 0.5: ret[1] = {v.expr: rng.randint(v.min, v.max) for v in vars_}
  return ret if ret[0] != ret[1] else ret[:1]

def _float_tol(ast_store: LazyOp) -> float:
  """The tolerance of an inexact float output: by the narrowest float dtype anywhere in its tree."""
  dts = {x.dtype for x in ast_store.lazyops if x.dtype is not None} | {x.arg for x in ast_store.lazyops
                                                                        if x.op is UnaryOps.CAST}
  if BF16 in dts: return 6e-2
  if F16 in dts: return 3e-2
  return 2e-4

def _tol(v: V, ast_store: LazyOp) -> float:
  return 0.0 if v.dt not in FLOATS or v.exact else _float_tol(ast_store)

_INEXACT = (UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN, UnaryOps.SQRT, UnaryOps.RECIP)

def _shrunk_tol(tol: float, ast_store: LazyOp) -> float:
  """A shrunk output's tolerance: the original's, unless the original was exact and the shrunk tree computes a float
  through an op that rounds (a transcendental, RECIP or float IDIV: a subtree the original never compared exactly)."""
  if tol or ast_store.arg.dtype not in FLOATS: return tol
  inexact = any(x.op in _INEXACT or (x.op is BinaryOps.IDIV and x.dtype in FLOATS) for x in ast_store.lazyops)
  return _float_tol(ast_store) if inexact else tol

def generate_case(seed: int, index: int) -> Case:
  """The index-th case of seed (deterministic): a verified AST with its inputs."""
  rng = random.Random(f"fuzz-ast:{seed}:{index}")
  while True:
    g = Gen(rng)
    try: ast, roots, bufs = g.kernel()
    except ShapeError: continue
    verify_lazyop(ast)
    var_vals = _var_vals(rng, g.vars)
    try: case = _finish(g, ast, roots, bufs, var_vals, seed)
    except orc.OracleError: continue
    return case

def _finish(g: Gen, ast: LazyOp, roots: list, bufs: dict[int, InBuf], var_vals: list, seed: int) -> Case:
  at_max = {v.expr: v.max for v in g.vars}
  sizes: dict[int, int] = {}
  dts: dict[int, DType] = {}
  for st_op in ast.src:
    sizes[st_op.arg.idx] = max(max(orc.needed_size(st_op.arg.st, vv) for vv in var_vals + [at_max]), 1)
    dts[st_op.arg.idx] = st_op.arg.dtype
  for idx, b in bufs.items():
    sizes[idx] = max([1] + [orc.needed_size(st, vv) for st in b.views for vv in var_vals + [at_max]])
    dts[idx] = b.dtype
  nrng = np.random.default_rng(abs(hash(("data", seed, ast_digest_short(ast)))) % (1 << 32))
  inputs = {idx: make_data(nrng, b, sizes[idx]) for idx, b in bufs.items()}
  tols = {i: _tol(v, ast.src[i]) for i, v in roots}
  wild = {i for i, v in roots if v.wild}
  tags = Counter({k: v for k, v in g.tags.items() if k.startswith(("cast ", "bitcast ", "cmp ", "dead ", "matmul"))})
  tags.update(_features(ast, at_max))
  for x in ast.lazyops:
    if x.op in (BufferOps.LOAD, BufferOps.CONST, BufferOps.STORE, MetaOps.KERNEL): continue
    src_dt = x.src[0].dtype if x.op is not TernaryOps.WHERE else x.src[1].dtype
    tags[("op", x.op.name if x.op not in ReduceOps else f"R{x.op.name}", src_dt.name)] += 1
  case = Case(ast, sizes, dts, [s.arg.idx for s in ast.src], inputs, var_vals, tols, wild, tags, seed)
  case_refs(case)   # the oracle must evaluate it
  return case

def _features(ast: LazyOp, vv: dict[str, int]) -> Counter:
  """What the coverage table counts about an AST's buffers, read off the final AST."""
  c: Counter = Counter()
  if len(ast.src) > 1: c["multi-output"] += 1
  if ast.vars(): c["symbolic"] += 1
  if any(x.op is ReduceOps.SUM and x.src[0].op in (BinaryOps.MUL, UnaryOps.CAST) for x in ast.lazyops):
    c["sum of products"] += 1
  reduces = [x for x in ast.lazyops if x.op in ReduceOps]
  if len(reduces) > 1: c["several reduces"] += 1
  if len({x.arg for x in reduces}) > 1: c["reduces over different axes"] += 1
  if any(y.op in ReduceOps for x in reduces for y in x.lazyops[:-1]): c["nested reduce"] += 1
  for x in ast.lazyops:
    if x.op in ReduceOps: c[f"reduce {x.op.name}"] += 1
    if x.op not in BufferOps: continue
    views = x.arg.st.views
    if x.op is BufferOps.CONST:
      c["const"] += 1
      if not isinstance(x.arg.val, (bool, int, float)): c["symbolic const"] += 1
      if views[-1].mask is not None: c["masked const"] += 1
      continue
    if x.op is BufferOps.STORE:
      if not x.arg.st.contiguous: c["strided store"] += 1
      continue
    c["load"] += 1
    _, valid = orc.st_index(x.arg.st, vv)
    if not valid.any(): c["fully masked load"] += 1
    elif any(v.mask is not None for v in views): c["padded load"] += 1
    if any(not (isinstance(v.offset, int) and v.offset == 0) for v in views): c["shrunk/offset load"] += 1
    if any(s == 0 and not (isinstance(d, int) and d == 1) for s, d in zip(views[-1].strides, views[-1].shape)):
      c["broadcast load"] += 1
    if any(isinstance(s, int) and s < 0 for v in views for s in v.strides): c["flipped load"] += 1
    if len(views) > 1: c["multi-view load"] += 1
  return c

def ast_digest_short(ast: LazyOp) -> str:
  import hashlib
  return hashlib.sha256(json.dumps(ast_to_json(ast), sort_keys=True).encode()).hexdigest()[:16]

def sentinel(case: Case, idx: int) -> np.ndarray:
  return np.full(case.sizes[idx] * case.dtypes[idx].itemsize, SENTINEL_BYTE, np.uint8).view(orc.storage_np(
    case.dtypes[idx]))

def case_refs(case: Case) -> list[tuple[dict[int, np.ndarray], dict[int, np.ndarray], dict[int, float]]]:
  """The oracle's (outputs, written masks, scales) at each var_vals."""
  ret = []
  for vv in case.var_vals:
    ev = orc.evaluate(case.ast, case.inputs, {i: sentinel(case, i) for i in case.outputs}, vv)
    ret.append(({i: ev.buffers[i] for i in case.outputs}, ev.written, ev.scale))
  return ret

def compare(ref: np.ndarray, got: np.ndarray, written: np.ndarray, dt: DType, rtol: float, scale: float,
            wild: bool) -> Optional[str]:
  """None when got matches ref: unwritten elements and ints/bools/exact floats bit for bit (floats: -0 == 0), other
  floats within rtol with atol = rtol*max(1, scale), NaN where the oracle has NaN."""
  if got.shape != ref.shape: return f"shape {got.shape} != {ref.shape}"
  gb, rb = got.view(np.uint8).reshape(got.size, -1), ref.view(np.uint8).reshape(ref.size, -1)
  bad_unwritten = ~written & (gb != rb).any(1)
  if bad_unwritten.any():
    i = np.flatnonzero(bad_unwritten)
    return f"{i.size} elements the kernel must not write changed, first at {i[:8].tolist()}"
  if wild or dt not in FLOATS:
    r, g = (ref.view(np.uint8), got.view(np.uint8)) if wild else (ref, got)
    if wild: r, g = r.reshape(ref.size, -1), g.reshape(got.size, -1)
    bad = (r != g).any(1) if wild else (r != g)
  else:
    rv, gv = (orc.bf16_value(ref), orc.bf16_value(got)) if dt == BF16 else (ref.astype(np.float64),
                                                                             got.astype(np.float64))
    rv, gv = rv.astype(np.float64), gv.astype(np.float64)
    nan_r, nan_g = np.isnan(rv), np.isnan(gv)
    with np.errstate(invalid="ignore"):
      close = (rv == gv) | (np.abs(rv - gv) <= rtol * np.abs(rv) + rtol * max(1.0, scale))
    bad = (nan_r != nan_g) | (~nan_r & ~close)
  bad &= written
  if not bad.any(): return None
  i = np.flatnonzero(bad)
  return (f"{i.size} of {int(written.sum())} written elements differ, first at {i[:6].tolist()}: "
          f"expected {ref[i[:6]].tolist()}, got {got[i[:6]].tolist()}")

# ***** devices and plans *****

def device_configs(index: int, opencl: bool) -> list[tuple[str, dict]]:
  """Every device present; the native CPU also pinned to one vector width per case, in turn 4, 8, 16."""
  ret = [("CPU", {}), ("CPU", {"vector_width": (4, 8, 16)[index % 3]}), ("CPU", {"profile": "static"}),
         ("PYTHON", {}), ("PYTHON", {"emulate": "CUDA"}), ("PYTHON", {"emulate": "METAL"}),
         ("PYTHON", {"emulate": "AMD"})]
  if opencl: ret.append(("OPENCL", {}))
  return ret

ALL_PLANS = ("none", "std", "rand")

def plans_for(device: str, options: dict, index: int) -> tuple[str, ...]:
  """The plans a case runs on a device: all three where compiling is cheap (PYTHON) or the device is the main one
  (native CPU); the pinned-width CPU the width-dependent heuristics; the static CPU and OpenCL (a compile costs ~1 s
  on PoCL) one plan per case in turn, so every plan meets every device over a run."""
  if device == "PYTHON" or (device == "CPU" and not options): return ALL_PLANS
  if "vector_width" in options: return ("std",) if index % 2 else ("rand",)
  return (("std", "none", "std", "rand")[index % 4],)

CL_BINARY_EVERY = 8

def knobs_for(device: str, index: int) -> dict:
  """Config knobs a case's kernels build under. OPENCL stores the built program's binary in the disk cache for one
  case in CL_BINARY_EVERY: PoCL makes that binary by compiling a work-group function the launch never uses (on average
  more CPU than the build, seconds for a big kernel), and the fuzz never builds the same source twice to read it."""
  return {"DISABLE_CACHE": 1} if device == "OPENCL" and index % CL_BINARY_EVERY else {}

def dev_label(name: str, options: dict) -> str:
  return name + "".join(f",{k}={v}" for k, v in sorted(options.items()))

def _opencl_present() -> bool:
  from kernopt.runtime import Device
  return Device.why_unavailable("OPENCL") is None

# ***** the worker: builds, compiles and runs kernels; restarted after a crash *****

def _send(f: Any, obj: Any) -> None:
  data = pickle.dumps(obj)
  f.write(struct.pack("<Q", len(data)) + data)
  f.flush()

def _recv_blocking(f: Any) -> Any:
  head = f.read(8)
  if len(head) < 8: raise EOFError
  n = struct.unpack("<Q", head)[0]
  return pickle.loads(f.read(n))

def recreate_dead_load_bug() -> None:
  """Test-only: the signature before the fix. Every BufferArg claims `used`, so the runner passes every buffer by
  position and the CPU's argtypes count them all, while the source still lacks the folded-away parameters."""
  import kernopt.kernel
  from kernopt.renderers import BufferArg
  kernopt.kernel.BufferArg = lambda idx, dtype, min_size, writable, used=True: BufferArg(  # type: ignore
    idx, dtype, min_size, writable, True)

def _random_opts(k: Any, rng: random.Random, n: int) -> None:
  from kernopt import search_space
  from kernopt.kernel import Opt, OptOps
  for _ in range(n):
    acts = search_space.actions(k) + [Opt(OptOps.MERGE, a) for a in range(k.shape_len)]
    rng.shuffle(acts)
    for o in acts[:200]:
      trial = k.copy()
      try: trial.apply_opt(o)
      except KernoptError: continue
      up = math.prod(s for s in trial.full_shape[trial.shape_len - trial.upcasted:] if isinstance(s, int))
      if up > MAX_UPCAST_PRODUCT: continue
      k.apply_opt(o)
      break

def _handle(req: dict) -> dict:
  from kernopt.helpers import config_override
  with config_override(**req.get("knobs", {})): return _build_and_run(req)

def _build_and_run(req: dict) -> dict:
  from kernopt.kernel import Kernel, Opt, OptOps
  from kernopt.runtime import Buffer, Device
  from kernopt.shape.symbolic import sym_infer
  stage, k = "device", None
  try:
    dev = Device.open(req["device"], **req["options"])
    stage = "kernel"
    k = Kernel(req["ast"], opts=dev.renderer)
    plan = req["plan"]
    stage = "opts"
    tc = False
    if plan[0] == "std":
      k.required_optimizations()
      if not (tc := k.apply_tensor_cores()): k.hand_coded_optimizations()
    elif plan[0] == "rand": _random_opts(k, random.Random(plan[1]), plan[2])
    elif plan[0] == "opts":
      for o in plan[1]: k.apply_opt(Opt(OptOps[o[0]], o[1], o[2]))
    opts = [[o.op.name, o.axis, o.amt] for o in k.applied_opts]
    stage = "program"
    prg = k.to_program()
    stage = "compile"
    runner = dev.compile(prg)
    stage = "launch"
    # the signature's sizes are conservative under masks (contracts.md): grow a buffer the oracle sized exactly
    grown = {}
    for a in prg.args:
      if not a.used: continue
      need = max(sym_infer(a.min_size, {v: vv[v.expr] for v in prg.vars}) for vv in req["var_vals"])
      if need > req["buffers"][a.idx][0]: grown[a.idx] = need
    outs = []
    for vv in req["var_vals"]:
      bufs = {}
      for idx, (size, dt) in req["buffers"].items():
        data = req["init"][idx] if idx in req["init"] else req["inputs"][idx]
        if idx in grown:
          fill = data[:1].repeat(grown[idx] - size) if idx in req["init"] else np.zeros(grown[idx] - size, data.dtype)
          data = np.concatenate([data, fill])
        bufs[idx] = Buffer(dev.name, data.size, dt)
        bufs[idx].copyin(data)
      runner(*[bufs[a.idx] for a in prg.args], var_vals=vv, wait=True)
      outs.append({i: bufs[i].numpy()[:req["buffers"][i][0]] for i in req["init"]})
    return {"status": "ok", "opts": opts, "outs": outs, "unused": [a.idx for a in prg.args if not a.used], "tc": tc,
            "grown": grown}
  except KernoptError as e:
    opts = [[o.op.name, o.axis, o.amt] for o in k.applied_opts] if k is not None else []
    # what a device may refuse: an Opt, or a dtype or feature it lacks; any other KernoptError on a valid AST with
    # right-sized buffers (a CompileError of kernopt's own source, a LaunchError) is a failure
    status = "refused" if isinstance(e, (UnsupportedError, KernelOptError)) else "kernopt-error"
    msg = str(e)[:400] if status == "refused" else f"{str(e)[:1200]}\n{getattr(e, 'src', '')[-2500:]}"
    return {"status": status, "stage": stage, "exc": type(e).__name__, "msg": msg, "opts": opts}
  except Exception as e:
    opts = [[o.op.name, o.axis, o.amt] for o in k.applied_opts] if k is not None else []
    return {"status": "error", "stage": stage, "exc": type(e).__name__, "msg": traceback.format_exc(limit=6)[-1500:],
            "opts": opts}

def _worker_main() -> None:
  if os.environ.get("FUZZ_AST_OLD_SIGNATURE") == "1": recreate_dead_load_bug()
  # nothing but results on the pipe: fd 1 (where a compiler or driver might print) goes to stderr
  inp, out = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
  os.dup2(2, 1)
  sys.stdout = sys.stderr
  while True:
    try: req = _recv_blocking(inp)
    except EOFError: return
    _send(out, _handle(req))

class Worker:
  """A persistent child process running _handle; a crash or a timeout is reported and the child restarted."""
  def __init__(self, old_signature: bool = False):
    self.env = dict(os.environ, FUZZ_AST_OLD_SIGNATURE="1" if old_signature else "0")
    self.proc: Optional[subprocess.Popen] = None
    self.err = tempfile.TemporaryFile()

  def _start(self) -> None:
    self.err.seek(0)
    self.err.truncate()
    self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=self.err, env=self.env, cwd=_ROOT)

  def request(self, req: dict, timeout: float = REQUEST_TIMEOUT_S) -> dict:
    if self.proc is None or self.proc.poll() is not None: self._start()
    assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
    try: _send(self.proc.stdin, req)
    except BrokenPipeError: return self._died("crash", "the worker died before the request")
    fd, buf, need, deadline = self.proc.stdout.fileno(), b"", 8, time.time() + timeout
    while len(buf) < need:
      left = deadline - time.time()
      if left <= 0 or not select.select([fd], [], [], left)[0]:
        return self._died("timeout", f"no result within {timeout:.0f}s")
      chunk = os.read(fd, max(need - len(buf), 1 << 16))
      if not chunk: return self._died("crash", f"the worker exited with {self.proc.wait()}")
      buf += chunk
      if need == 8 and len(buf) >= 8: need = 8 + struct.unpack("<Q", buf[:8])[0]
    return pickle.loads(buf[8:need])

  def _died(self, kind: str, why: str) -> dict:
    if self.proc is not None:
      if self.proc.poll() is None: self.proc.kill()
      self.proc.wait()
    self.err.seek(0)
    tail = self.err.read()[-1500:].decode(errors="replace")
    self.proc = None
    return {"status": kind, "stage": "?", "exc": kind, "msg": f"{why}\n{tail}", "opts": []}

  def close(self) -> None:
    if self.proc is not None and self.proc.poll() is None:
      self.proc.stdin.close()  # type: ignore[union-attr]
      try: self.proc.wait(timeout=10)
      except subprocess.TimeoutExpired: self.proc.kill()
    self.proc = None

# ***** running a case *****

@dataclass
class Failure:
  kind: str        # mismatch | crash | timeout | error (a non-kernopt exception) | kernopt-error
  case: Case
  device: str
  options: dict
  plan: tuple
  opts: list
  detail: str
  def __str__(self) -> str:
    return f"[{self.kind}] seed={self.case.seed} {dev_label(self.device, self.options)} plan={self.plan[0]} " \
           f"opts={self.opts}: {self.detail[:1200]}"

@dataclass
class Stats:
  asts: int = 0
  runs: Counter = field(default_factory=Counter)        # device -> kernels that ran and matched
  refusals: Counter = field(default_factory=Counter)    # (device, error, message head) -> count
  failures: Counter = field(default_factory=Counter)    # kind -> count
  tags: Counter = field(default_factory=Counter)
  unused_args: int = 0
  seconds: float = 0.0

  def merge(self, o: Stats) -> None:
    self.asts += o.asts
    self.runs.update(o.runs)
    self.refusals.update(o.refusals)
    self.failures.update(o.failures)
    self.tags.update(o.tags)
    self.unused_args += o.unused_args
    self.seconds += o.seconds

  def to_json(self) -> dict:
    return {"asts": self.asts, "runs": dict(self.runs), "refusals": [[list(k), v] for k, v in self.refusals.items()],
            "failures": dict(self.failures), "tags": [[list(k) if isinstance(k, tuple) else k, v]
                                                       for k, v in self.tags.items()],
            "unused_args": self.unused_args, "seconds": self.seconds}

  @staticmethod
  def from_json(d: dict) -> Stats:
    s = Stats(d["asts"], Counter(d["runs"]), Counter({tuple(k): v for k, v in d["refusals"]}), Counter(d["failures"]),
              Counter({(tuple(k) if isinstance(k, list) else k): v for k, v in d["tags"]}), d["unused_args"],
              d["seconds"])
    return s

  def table(self) -> str:
    ops = sorted({k[1] for k in self.tags if isinstance(k, tuple)})
    dts = [d.name for d in (BOOL,) + INTS + FLOATS if any(isinstance(k, tuple) and k[2] == d.name for k in self.tags)]
    short = {d: d.replace("unsigned ", "u") for d in dts}
    lines = [f"fuzz-ast coverage: {self.asts} ASTs in {self.seconds:.0f}s; kernels matched per device:"]
    lines += [f"  {d}: {n}" for d, n in sorted(self.runs.items())]
    lines.append(f"failures: {dict(self.failures) or 0}; unused (folded-away) buffer args seen: {self.unused_args}")
    lines.append("ops x operand dtypes (ops in generated ASTs):")
    lines.append(f"{'':>8} " + " ".join(f"{short[d]:>7}" for d in dts))
    for o in ops:
      lines.append(f"{o:>8} " + " ".join(f"{self.tags.get(('op', o, d), 0):>7}" for d in dts))
    lines.append("features: " + ", ".join(f"{k}: {v}" for k, v in sorted(
      (k, v) for k, v in self.tags.items() if isinstance(k, str) and not k.startswith(("cast ", "bitcast ", "cmp ")))))
    casts = sorted((k, v) for k, v in self.tags.items() if isinstance(k, str) and k.startswith(("cast ", "bitcast ")))
    lines.append(f"distinct casts/bitcasts: {len(casts)} ({sum(v for _, v in casts)} in all)")
    top = self.refusals.most_common(12)
    lines.append(f"accepted refusals: {sum(self.refusals.values())}" + "".join(
      f"\n  {n:>5} {d} {e}: {m}" for (d, e, m), n in top))
    return "\n".join(lines)

def _request(case: Case, device: str, options: dict, plan: tuple, knobs: Optional[dict] = None) -> dict:
  return {"ast": case.ast, "device": device, "options": options, "plan": plan, "knobs": knobs or {},
          "var_vals": case.var_vals,
          "buffers": {i: (case.sizes[i], case.dtypes[i]) for i in case.sizes},
          "init": {i: sentinel(case, i) for i in case.outputs},
          "inputs": {i: a for i, a in case.inputs.items()}}

def check(case: Case, res: dict, refs: list) -> Optional[tuple[str, str]]:
  """(kind, detail) of a failed result, None when it ran and matched or was refused with a KernoptError."""
  st = res["status"]
  if st == "refused": return None
  if st != "ok": return (st, f"{res['stage']}: {res['exc']}: {res['msg']}")
  for vv, outs, (ref, written, scale) in zip(case.var_vals, res["outs"], refs):
    for i in case.outputs:
      msg = compare(ref[i], outs[i], written.get(i, np.zeros(ref[i].size, bool)), case.dtypes[i], case.tols[i],
                    scale.get(i, 0.0), i in case.wild)
      if msg is not None: return ("mismatch", f"output {i} at var_vals={vv}: {msg}")
  return None

def run_case(worker: Worker, case: Case, index: int, stats: Stats, opencl: bool,
             only: Optional[list[tuple[str, dict]]] = None) -> list[Failure]:
  refs = case_refs(case)
  fails = []
  for device, options in (only or device_configs(index, opencl)):
    label = dev_label(device, options)
    for name in plans_for(device, options, index) if only is None else ALL_PLANS[:2]:
      plan = (name, index * 7919 + len(label), random.Random(index).randint(1, 4)) if name == "rand" else (name,)
      res = worker.request(_request(case, device, options, plan, knobs_for(device, index)))
      bad = check(case, res, refs)
      if res["status"] == "refused":
        stats.refusals[(label, res["exc"], res["msg"].split("\n")[0][:90])] += 1
      elif bad is None:
        stats.runs[label] += 1
        stats.unused_args += len(res["unused"])
        if res["tc"]: stats.tags[f"tensor cores applied on {label}"] += 1
        if res["grown"]: stats.tags["buffer grown to a conservative min_size"] += 1
      if bad is not None:
        stats.failures[bad[0]] += 1
        fails.append(Failure(bad[0], case, device, options, plan, res.get("opts", []), bad[1]))
  return fails

def run_fuzz(n: int, seed: int, old_signature: bool = False, shrink_limit: int = 2, save: bool = True,
             start: int = 0,
             only: Optional[list[tuple[str, dict]]] = None,
             max_s: Optional[float] = None) -> tuple[Stats, list[Failure], list[str]]:
  """n generated cases of seed on every device; returns stats, failures and the regression files written."""
  stats, fails, saved = Stats(), [], []
  opencl = _opencl_present()
  worker = Worker(old_signature)
  t0 = time.time()
  seen_kinds: Counter = Counter()
  try:
    for i in range(start, start + n):
      if max_s is not None and time.time() - t0 > max_s: break
      # a fresh worker every WORKER_CASES cases: each kernel's shared object stays mapped (about 5 mappings), and a
      # process past vm.max_map_count (65530) fails to load the next one ("failed to map segment", seen at ~3,500
      # cases of seed 41)
      if i > start and (i - start) % WORKER_CASES == 0: worker.close()
      case = generate_case(seed, i)
      stats.asts += 1
      stats.tags.update(case.tags)
      got = run_case(worker, case, i, stats, opencl, only)
      fails += got
      for f in got:
        key = (f.kind, f.device, f.detail.split(":")[0])
        seen_kinds[key] += 1
        if save and seen_kinds[key] <= shrink_limit:
          small = shrink(worker, f)
          saved.append(save_regression(small))
  finally:
    worker.close()
  stats.seconds = time.time() - t0
  return stats, fails, saved

# ***** shrinking *****

def _fails_same(worker: Worker, f: Failure, case: Case, plan: tuple) -> Optional[Failure]:
  try:
    verify_lazyop(case.ast)
    refs = case_refs(case)
  except (KernoptError, orc.OracleError, ValueError): return None
  res = worker.request(_request(case, f.device, f.options, plan))
  bad = check(case, res, refs)
  if bad is None or bad[0] != f.kind: return None
  if f.kind in ("error", "kernopt-error") and res.get("exc") != f.detail.split(":")[1].strip(): return None
  return Failure(bad[0], case, f.device, f.options, plan, res.get("opts", []), bad[1])

def _with_ast(case: Case, ast: LazyOp, extra_inputs: Optional[dict] = None) -> Case:
  """case with another AST over the same (or fewer) buffers; buffers it no longer names are dropped."""
  used = {x.arg.idx for x in ast.lazyops if x.op in (BufferOps.LOAD, BufferOps.STORE)}
  inputs = {i: a for i, a in {**case.inputs, **(extra_inputs or {})}.items() if i in used}
  sizes = {i: s for i, s in case.sizes.items() if i in used}
  dts = {i: d for i, d in case.dtypes.items() if i in used}
  ast_dts = {x.arg.idx: x.arg.dtype for x in ast.lazyops if x.op in (BufferOps.LOAD, BufferOps.STORE)}
  for i, a in (extra_inputs or {}).items(): sizes[i], dts[i] = a.size, ast_dts[i]   # a new buffer: its LOAD's dtype
  outs = [s.arg.idx for s in ast.src]
  tols = {s.arg.idx: _shrunk_tol(case.tols[s.arg.idx], s) for s in ast.src}
  return Case(ast, sizes, dts, outs, inputs, case.var_vals, tols,
              {i for i in case.wild if i in outs}, case.tags, case.seed)

def _replace(ast: LazyOp, old: LazyOp, new: LazyOp) -> LazyOp:
  memo: dict[LazyOp, LazyOp] = {}
  for x in ast.lazyops:
    memo[x] = new if x is old or x == old else LazyOp(x.op, tuple(memo[s] for s in x.src), x.arg)
  return memo[ast]

def _candidates(case: Case) -> list[tuple[LazyOp, dict]]:
  """Smaller ASTs: fewer STOREs, a subtree replaced by one of its sources, a const, or a load of its value."""
  ast, ret = case.ast, []
  if len(ast.src) > 1:
    for s in ast.src: ret.append((LazyOp(MetaOps.KERNEL, (s,)), {}))
  shapes = verify_lazyop(ast)
  sizes_known = not ast.vars()
  nxt = max(case.sizes) + 1
  ev = orc.evaluate(ast, case.inputs, {i: sentinel(case, i) for i in case.outputs}, case.var_vals[0]) \
    if sizes_known else None
  for x in reversed(ast.lazyops):   # the biggest subtrees first
    if x.op in (BufferOps.STORE, MetaOps.KERNEL, BufferOps.CONST): continue
    shp = shapes[x].shape
    for s in x.src:
      if s.dtype == x.dtype and shapes[s].shape == shp: ret.append((_replace(ast, x, s), {}))
    st = ShapeTracker((View.create(shp, (0,) * len(shp)),))
    zero = False if x.dtype == BOOL else 0.0 if x.dtype in FLOATS else 0
    ret.append((_replace(ast, x, LazyOp(BufferOps.CONST, (), ConstBuffer(zero, x.dtype, st))), {}))
    if ev is not None and x in ev.memo and (x.op is not BufferOps.LOAD or x.arg.st.views[-1].mask is not None):
      ld = LazyOp(BufferOps.LOAD, (), MemBuffer(nxt, x.dtype, ShapeTracker.from_shape(shp)))
      ret.append((_replace(ast, x, ld), {nxt: orc.to_storage(ev.memo[x], x.dtype).reshape(-1)}))
  return ret

def shrink(worker: Worker, f: Failure, budget_s: float = 90.0) -> Failure:
  """Greedy: keep the first smaller AST (then shorter opts, fewer var_vals) that fails the same way."""
  t0 = time.time()
  cur = f
  plan = ("opts", cur.opts) if cur.plan[0] == "rand" else cur.plan
  if (again := _fails_same(worker, cur, cur.case, plan)) is not None: cur = again
  else: plan = cur.plan
  progress = True
  while progress and time.time() - t0 < budget_s:
    progress = False
    if len(cur.case.var_vals) > 1:
      for vv in cur.case.var_vals:
        c = Case(**{**cur.case.__dict__, "var_vals": [vv]})
        if (g := _fails_same(worker, cur, c, plan)) is not None:
          cur, progress = g, True
          break
    for ast, extra in _candidates(cur.case):
      if time.time() - t0 > budget_s: break
      if len(ast.lazyops) >= len(cur.case.ast.lazyops) and not (extra == {} and ast != cur.case.ast): continue
      c = _with_ast(cur.case, ast, extra)
      if (g := _fails_same(worker, cur, c, plan)) is not None:
        cur, progress = g, True
        break
    if plan[0] == "opts" and plan[1]:
      for j in range(len(plan[1])):
        p2 = ("opts", plan[1][:j] + plan[1][j + 1:])
        if (g := _fails_same(worker, cur, cur.case, p2)) is not None:
          cur, plan, progress = g, p2, True
          break
  compact = _compacted(cur.case)
  if compact is not None and (g := _fails_same(worker, cur, compact, plan)) is not None: cur = g
  cur.plan = plan
  return cur

def _compacted(case: Case) -> Optional[Case]:
  """case with its buffers renumbered 0, 1, ... in the same order (None when they already are)."""
  order = sorted(case.sizes)
  if order == list(range(len(order))): return None
  ren = {old: new for new, old in enumerate(order)}
  memo: dict[LazyOp, LazyOp] = {}
  for x in case.ast.lazyops:
    arg = MemBuffer(ren[x.arg.idx], x.arg.dtype, x.arg.st) if isinstance(x.arg, MemBuffer) else x.arg
    memo[x] = LazyOp(x.op, tuple(memo[s] for s in x.src), arg)
  ast = memo[case.ast]
  return Case(ast, {ren[i]: v for i, v in case.sizes.items()}, {ren[i]: v for i, v in case.dtypes.items()},
              [ren[i] for i in case.outputs], {ren[i]: v for i, v in case.inputs.items()}, case.var_vals,
              {ren[i]: v for i, v in case.tols.items()}, {ren[i] for i in case.wild}, case.tags, case.seed)

# ***** regression files *****

def _arr_json(a: np.ndarray, dt: DType) -> dict:
  return {"dtype": dt.name if dt != BF16 else "bfloat16", "data": a.tolist()}

def _arr_from(d: dict) -> tuple[np.ndarray, DType]:
  dt = dtypes.from_name(d["dtype"])
  return np.asarray(d["data"], dtype=orc.storage_np(dt)), dt

def save_regression(f: Failure, folder: str = REGRESSIONS) -> str:
  c = f.case
  rec = {"format": 1, "kind": f.kind, "detail": f.detail[:2000], "device": f.device, "options": f.options,
         "plan": list(f.plan[:1]) + ([f.plan[1]] if f.plan[0] == "opts" else list(f.plan[1:3]) if f.plan[0] == "rand"
                                      else []), "opts": f.opts, "seed": c.seed,
         "var_vals": c.var_vals, "ast": ast_to_json(c.ast),
         "buffers": {str(i): {"size": c.sizes[i], "dtype": c.dtypes[i].name} for i in c.sizes},
         "inputs": {str(i): _arr_json(a, c.dtypes[i]) for i, a in c.inputs.items()},
         "tols": {str(i): t for i, t in c.tols.items()}, "wild": sorted(c.wild)}
  os.makedirs(folder, exist_ok=True)
  name = f"{f.kind}-{f.device.lower()}-{ast_digest_short(c.ast)[:12]}.json"
  path = os.path.join(folder, name)
  if not os.path.exists(path):
    with open(path, "w") as fh: json.dump(rec, fh, indent=1)
  return path

def load_regression(path: str) -> tuple[Case, dict]:
  with open(path) as fh: rec = json.load(fh)
  ast = ast_from_json(rec["ast"])
  sizes = {int(i): b["size"] for i, b in rec["buffers"].items()}
  dts = {int(i): dtypes.from_name(b["dtype"]) for i, b in rec["buffers"].items()}
  inputs = {int(i): _arr_from(d)[0] for i, d in rec["inputs"].items()}
  outs = [s.arg.idx for s in ast.src]
  case = Case(ast, sizes, dts, outs, inputs, rec["var_vals"], {int(i): t for i, t in rec["tols"].items()},
              set(rec["wild"]), Counter(), rec["seed"])
  return case, rec

def replay_plan(rec: dict) -> tuple:
  """The plan a regression file replays: its Opts when the failing run reported them, else the random plan itself
  (its seed and count; a timeout or a crash reports no Opts)."""
  plan = rec["plan"]
  if plan[0] != "rand": return tuple(plan)
  return ("opts", rec["opts"]) if rec["opts"] or len(plan) < 3 else ("rand", plan[1], plan[2])

def replay(worker: Worker, path: str) -> Optional[str]:
  """None when the saved case now runs and matches the oracle on its device (or the device is absent)."""
  case, rec = load_regression(path)
  plan = replay_plan(rec)
  res = worker.request(_request(case, rec["device"], rec["options"], plan))
  bad = check(case, res, case_refs(case))
  return None if bad is None else f"[{bad[0]}] {bad[1][:1500]}"

# ***** the tests *****

def _write_stats(stats: Stats, name: str) -> None:
  if (folder := os.environ.get("FUZZ_AST_STATS")):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{name}.json"), "w") as fh: json.dump(stats.to_json(), fh)

def _need_cc() -> None:
  import pytest
  from kernopt.runtime import Device
  if Device.why_unavailable("CPU") is not None: pytest.skip("no C compiler")

def _chunk_n(chunk: int) -> int: return FUZZ_AST_N // CHUNKS + (chunk < FUZZ_AST_N % CHUNKS)

def _params() -> list[int]: return list(range(CHUNKS))

if __name__ != "__main__":
  import pytest

  @pytest.mark.parametrize("chunk", _params())
  def test_fuzz_ast(chunk: int, record_property: Any) -> None:
    _need_cc()
    seed = FUZZ_AST_SEED * 1000 + chunk
    stats, fails, saved = run_fuzz(_chunk_n(chunk), seed, start=FUZZ_AST_START, max_s=FUZZ_AST_MAX_S)
    table = stats.table()
    print("\n" + table)
    record_property("coverage", table)
    _write_stats(stats, f"chunk{chunk}-seed{seed}-start{FUZZ_AST_START}")   # cases [start, start + asts)
    assert not fails, f"{len(fails)} failures (regressions saved: {saved}):\n" + "\n".join(str(f) for f in fails[:8])

  def test_a_shrunk_inexact_float_output_is_not_compared_exactly() -> None:
    """Shrinking can replace an exact output by the subtree of an inexact branch (the bf16 SQRT / 1.75 'mismatch'):
    the shrunk output gets its dtype's tolerance; an exact subtree, or an int output, keeps the original's."""
    from kernopt import ast as A
    c = A.const(1.75, BF16, (4,))
    inexact = A.kernel(A.store(0, A.idiv(A.sqrt(c), c))).src[0]
    exact = A.kernel(A.store(0, A.add(c, c))).src[0]
    ints = A.kernel(A.store(0, A.load(1, dtypes.int32, (4,)))).src[0]
    assert _shrunk_tol(0.0, inexact) == 6e-2 and _shrunk_tol(0.0, exact) == 0.0 and _shrunk_tol(0.0, ints) == 0.0
    assert _shrunk_tol(2e-4, exact) == 2e-4

  def test_a_timeout_file_replays_its_random_opts(tmp_path: Any) -> None:
    """A timeout or a crash reports no Opts: its regression file keeps the random plan's seed and count, and the
    replay draws the same Opts again (a file with only 'rand' replayed an unoptimized kernel)."""
    c = generate_case(12345, 3)
    path = save_regression(Failure("timeout", c, "CPU", {}, ("rand", 4711, 3), [], "no result"), str(tmp_path))
    _, rec = load_regression(path)
    assert replay_plan(rec) == ("rand", 4711, 3)
    path = save_regression(Failure("mismatch", c, "PYTHON", {}, ("rand", 4711, 3), [["UPCAST", 0, 4]], "x"),
                           str(tmp_path))
    assert replay_plan(load_regression(path)[1]) == ("opts", [["UPCAST", 0, 4]])

  def test_generated_asts_verify_and_round_trip() -> None:
    for i in range(40):
      c = generate_case(12345, i)
      verify_lazyop(c.ast)
      assert ast_from_json(json.loads(json.dumps(ast_to_json(c.ast)))) == c.ast

  def test_oracle_follows_the_op_semantics() -> None:
    """Spot checks of the oracle against DESIGN.md's text (not against kernopt)."""
    i32 = dtypes.int32
    a = orc.from_storage(np.array([7, -7, 7, -7, -2**31, 5], np.int32), i32)
    b = orc.from_storage(np.array([2, 2, -2, -2, -1, 0], np.int32), i32)
    assert orc._alu(BinaryOps.IDIV, i32, [a, b], [i32, i32]).tolist() == [3, -3, -3, 3, -2**31, 0]
    assert orc._alu(BinaryOps.MOD, i32, [a, b], [i32, i32]).tolist() == [1, -1, 1, -1, 0, 0]
    assert orc._alu(BinaryOps.ADD, i32, [a, a], [i32, i32]).tolist()[4] == 0
    f = np.array([1.0, np.nan], np.float32)
    m = orc._alu(BinaryOps.MAX, F32, [f[::-1], f], [F32, F32])   # a > b ? a : b, and nan > x is false
    assert m[0] == 1.0 and np.isnan(m[1])
    assert orc._alu(BinaryOps.IDIV, F32, [f, np.float32([4, 4])], [F32, F32])[0] == 0.25
    assert orc.to_storage(np.float32([1 + 2**-11]), F16)[0] == 1.0   # ties to even

  def test_oracle_reads_views_by_their_fields() -> None:
    st = ShapeTracker.from_shape((4,)).pad(((4, 0),)).shrink(((0, 4),))
    flat, valid = orc.st_index(st, {})
    assert not valid.any()
    st2 = ShapeTracker.from_shape((4, 6)).permute((1, 0)).reshape((3, 8))
    flat, valid = orc.st_index(st2, {})
    assert valid.all() and flat.reshape(-1).tolist() == np.arange(24).reshape(4, 6).T.reshape(-1).tolist()

  def test_dead_load_bug_is_found_with_the_fix_switched_off() -> None:
    """With the old signature (buffers by position), the default-sized fuzz finds the dead-load mismatch."""
    _need_cc()
    n = max(FUZZ_AST_N // CHUNKS, 8)
    for s in range(4):
      stats, fails, _ = run_fuzz(n, 777 + s, old_signature=True, save=False, only=[("CPU", {})])
      cpu = [f for f in fails if f.device == "CPU" and f.kind == "mismatch"]
      if cpu: break
    assert cpu, f"no CPU mismatch in {stats.asts} ASTs with the dead-load bug switched back on"
    w = Worker(old_signature=True)
    try: small = shrink(w, cpu[0], budget_s=40)
    finally: w.close()
    print(f"\ndead-load bug found in {stats.asts} ASTs ({len(fails)} failures); shrunk to "
          f"{len(small.case.ast.lazyops)} ops from {len(cpu[0].case.ast.lazyops)}:\n{small}")
    assert len(small.case.ast.lazyops) <= len(cpu[0].case.ast.lazyops)

  def _regression_files() -> list[str]:
    if not os.path.isdir(REGRESSIONS): return []
    return sorted(os.path.join(REGRESSIONS, f) for f in os.listdir(REGRESSIONS) if f.endswith(".json"))

  def _xfail_marks(path: str) -> list:
    with open(path) as fh: why = json.load(fh).get("xfail")
    return [pytest.mark.xfail(strict=True, reason=why)] if why else []

  @pytest.fixture(scope="module")
  def replay_worker():
    w = Worker()
    yield w
    w.close()

  @pytest.mark.parametrize("path", [pytest.param(p, marks=_xfail_marks(p), id=os.path.basename(p))
                                    for p in _regression_files()])
  def test_regressions(path: str, replay_worker: Worker) -> None:
    from kernopt.runtime import Device
    with open(path) as fh: dev = json.load(fh)["device"]
    if (why := Device.why_unavailable(dev)) is not None: pytest.skip(why)
    assert (msg := replay(replay_worker, path)) is None, msg

if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
  _worker_main()
elif __name__ == "__main__" and sys.argv[1:2] == ["--merge"] and len(sys.argv) == 3:
  # the whole run's table from FUZZ_AST_STATS=<dir>: python tests/test_fuzz_ast.py --merge <dir>
  total = Stats()
  for fn in sorted(os.listdir(sys.argv[2])):
    with open(os.path.join(sys.argv[2], fn)) as fh: total.merge(Stats.from_json(json.load(fh)))
  print(total.table())
