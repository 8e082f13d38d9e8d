"""What mask conditions imply about index Variables: each condition (x, b, e) means b <= x < e, as View.expr_conds
gives them. `implied_bounds` narrows Variables by interval propagation through the affine conditions; `restrict`
rewrites an index over the narrowed ranges (and an affine condition of several Variables as one new Variable), so the
symbolic layer can simplify // and % that only matter where the conditions hold. Imports shape/symbolic."""
from __future__ import annotations
from typing import Any, Iterable, Optional, Sequence, Union
from kernopt.shape.symbolic import AndNode, DivNode, LtNode, ModNode, MulNode, Node, NumNode, SumNode, Variable, sint

def linear_form(x: Node) -> Optional[tuple[dict[Variable, int], int]]:
  """(coefficients, k) with x == Σ c·v + k over the Variables v of x, or None when x is not affine in them."""
  coefs: dict[Variable, int] = {}
  k = 0
  for t in (x.nodes if type(x) is SumNode else (x,)):
    if type(t) is NumNode: k += t.b
    elif type(t) is Variable: coefs[t] = coefs.get(t, 0) + 1
    elif type(t) is MulNode and type(t.a) is Variable and type(t.b) is int: coefs[t.a] = coefs.get(t.a, 0) + t.b
    else: return None
  return {v: c for v, c in coefs.items() if c}, k

def _span(c: int, r: list[int]) -> tuple[int, int]: return (c * r[0], c * r[1]) if c > 0 else (c * r[1], c * r[0])

def implied_bounds(conds: Iterable[tuple[Node, Any, Any]], rounds: int = 3) -> dict[Variable, tuple[int, int]]:
  """Each condition (x, b, e) means b <= x < e. Per Variable, a range [lo, hi] inside its own that holds at every
  point where all the conditions hold: interval propagation through the affine conditions with int b and e (others
  are ignored), `rounds` passes. Only the Variables whose range shrinks are returned; none when no point can satisfy
  the conditions (the caller then keeps what it had)."""
  forms = [(f, b, e) for x, b, e in conds if type(b) is int and type(e) is int and (f := linear_form(x)) is not None]
  rng: dict[Variable, list[int]] = {}
  for _ in range(rounds):
    changed = False
    for (coefs, k), b, e in forms:
      for v in coefs:
        r = rng.setdefault(v, [v.min, v.max])
        # c·v lies in [b - k - (the others' max), e - 1 - k - (the others' min)]
        rest = [_span(c, rng.get(w) or [w.min, w.max]) for w, c in coefs.items() if w is not v]
        lo_cv, hi_cv, c = b - k - sum(h for _, h in rest), e - 1 - k - sum(lo for lo, _ in rest), coefs[v]
        lo, hi = (-(-lo_cv // c), hi_cv // c) if c > 0 else (-(-hi_cv // c), lo_cv // c)
        if lo > r[0] or hi < r[1]:
          r[0], r[1], changed = max(r[0], lo), min(r[1], hi), True
          if r[0] > r[1]: return {}
    if not changed: break
  return {v: (r[0], r[1]) for v, r in rng.items() if (r[0], r[1]) != (v.min, v.max)}

def restrict(x: Node, conds: Sequence[tuple[Node, Any, Any]], fixed: Iterable[Variable] = ()) \
    -> Optional[tuple[Node, dict[Variable, Union[Node, int]]]]:
  """(y, back): y equals x at every point where the conditions (x, b, e: b <= x < e) hold, over Variables with the
  ranges the conditions imply, and y.substitute(back) is over x's own Variables again. Each affine condition of two or
  more Variables whose form, times one int m, is part of x's (x == m·form + rest) becomes one new Variable over the
  condition's range; the other Variables are narrowed by implied_bounds (except `fixed` ones). None when nothing is
  narrowed. Simplifying y (e.g. a // or %) and putting the Variables back gives an expression that is exact wherever
  the conditions hold, and only there."""
  keep = set(fixed)
  tight = {v: r for v, r in implied_bounds(conds).items() if v not in keep}
  xf = linear_form(x)
  back: dict[Variable, Union[Node, int]] = {}
  y: Node = x
  taken: set[Variable] = set()
  if xf is not None:
    coefs, k = xf
    prefix = "_" * (1 + max((len(v.expr) - len(v.expr.lstrip("_")) for v in x.vars()), default=0))
    for cx, b, e in conds:
      f = linear_form(cx) if type(b) is int and type(e) is int else None
      if f is None or len(f[0]) < 2 or any(v in taken or v in keep or v not in coefs for v in f[0]): continue
      v0, c0 = next(iter(f[0].items()))
      m = coefs[v0] // c0
      if m == 0 or any(coefs[v] != m * c for v, c in f[0].items()): continue
      form = Node.sum([v * c for v, c in f[0].items()])   # cx - its constant, over x's own Variables
      lo, hi = max(b - f[1], form.min), min(e - 1 - f[1], form.max)
      if lo > hi: return None
      z = Variable(f"{prefix}cond{len(back)}", lo, hi)
      back[z] = form
      taken |= f[0].keys()
      y = y - form * m + z * m
  narrowed = {v: Variable(v.expr, lo, hi) for v, (lo, hi) in tight.items() if v not in taken}
  if not back and not narrowed: return None
  if narrowed:
    y = y.substitute(dict(narrowed))
    back.update({t: v for v, t in narrowed.items()})
  return y, back

def count_divmod(n: sint) -> int:
  """How many DivNode and ModNode n holds."""
  if not isinstance(n, Node): return 0
  ret, stack = 0, [n]
  while stack:
    x = stack.pop()
    t = type(x)
    if t is DivNode or t is ModNode: ret += 1
    if t is SumNode or t is AndNode: stack.extend(x.nodes)  # type: ignore[attr-defined]
    elif t in (MulNode, DivNode, ModNode, LtNode):
      stack.append(x.a)  # type: ignore[attr-defined]
      if isinstance(x.b, Node): stack.append(x.b)  # type: ignore[attr-defined]
  return ret
