"""The lane mask of a masked vector load or store (the CPU profiles' packed loads of a padded window, stores of a padded
tile's last columns): which lanes of a group of gated scalar loads or stores may share one masked vector op, and the
int32 mask that opens each lane where its gate holds. Imports dtype, ops and uops."""
from __future__ import annotations
from typing import Optional
from kernopt.dtype import dtypes
from kernopt.ops import BinaryOps, TernaryOps
from kernopt.uops import UOp, UOps

_ALU, _CAST, _CONST = UOps.ALU, UOps.CAST, UOps.CONST
_ADD, _AND, _WHERE = BinaryOps.ADD, BinaryOps.AND, TernaryOps.WHERE

def maskable(ld: UOp) -> bool:
  """An ungated load, or a gated one whose index is guarded by its own gate and whose value is +0.0 when closed."""
  if len(ld.src) == 2: return not (ld.src[1].op is _ALU and ld.src[1].arg is _WHERE)
  alt, idx = ld.src[3], ld.src[1]
  return alt.op is _CONST and alt.arg == 0 and str(alt.arg)[0] != "-" and idx.op is _ALU and idx.arg is _WHERE and \
    idx.src[0] is ld.src[2]

def _conjuncts(g: UOp) -> list[UOp]:
  """g and, through bool ANDs, every conjunct of it (each an AND's operand), g first, in a fixed order."""
  out, todo, seen = [], [g], set()
  while todo:
    u = todo.pop()
    if u in seen: continue
    seen.add(u)
    out.append(u)
    if u.op is _ALU and u.arg is _AND and u.dtype == dtypes.bool: todo.extend(reversed(u.src))
  return out

def _lane_bits(fixed: int, per_gate: dict[UOp, int]) -> UOp:
  """fixed plus, per distinct gate, CAST(gate) * its lanes' bits."""
  i32 = dtypes.int32
  ret: Optional[UOp] = UOp(_CONST, i32, (), fixed) if fixed else None
  for gate, bits in per_gate.items():
    term = UOp(_ALU, i32, (UOp(_CAST, i32, (gate,)), UOp(_CONST, i32, (), bits)), BinaryOps.MUL)
    ret = term if ret is None else UOp(_ALU, i32, (ret, term), _ADD)
  assert ret is not None
  return ret

def masked_load_mask(members: tuple[UOp, ...]) -> UOp:
  """int32 lane mask of a masked vector load of maskable lanes (see lane_mask)."""
  return lane_mask(tuple(None if len(m.src) == 2 else m.src[2] for m in members))

def lane_mask(gates: tuple[Optional[UOp], ...]) -> UOp:
  """int32 lane mask of lanes gated by `gates` (None or a true constant: open; a false constant: closed): the open
  lanes' bits plus, per distinct gate, CAST(gate) * its lanes' bits. When every lane is gated and the gates share a
  conjunct c (a padded window's row check, shared by the lanes of one image row, whose first and last lanes add a
  column check), the mask is WHERE(c, the bits of the gates with c taken off, 0): the bits under c depend only on the
  column checks, which a C compiler hoists out of the reduce loops, and the row check costs one select (the
  reference's conv 64x56, 1 thread, Zen 3: 1.04x)."""
  fixed = 0
  per_gate: dict[UOp, int] = {}
  for lane, g in enumerate(gates):
    if g is None or (g.op is _CONST and g.arg): fixed |= 1 << lane
    elif g.op is not _CONST: per_gate[g] = per_gate.get(g, 0) | 1 << lane   # (a false constant: the lane is closed)
  if fixed or len(per_gate) < 2: return _lane_bits(fixed, per_gate)
  distinct = list(per_gate)
  others = [set(_conjuncts(g)) for g in distinct[1:]]
  shared = [c for c in _conjuncts(distinct[0]) if all(c in o for o in others)]
  if not shared: return _lane_bits(fixed, per_gate)
  c = shared[0]   # the first in the first gate's order: an AND before its own conjuncts
  under: dict[UOp, int] = {}
  for g, bits in per_gate.items():
    if g is c: fixed |= bits
    else:
      rest = g.src[1] if g.src[0] is c else g.src[0] if g.src[1] is c else g
      under[rest] = under.get(rest, 0) | bits
  i32 = dtypes.int32
  return UOp(_ALU, i32, (c, _lane_bits(fixed, under), UOp(_CONST, i32, (), 0)), _WHERE)
