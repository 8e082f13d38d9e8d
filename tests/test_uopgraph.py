"""uopgraph: one test per rewrite rule on a tiny hand-built graph, value bounds, and linearization (loop nesting,
hoisting, accumulator placement, ENDRANGE placement, IF/ENDIF around guarded stores)."""
from kernopt.dtype import dtypes
from kernopt.ops import BinaryOps, TernaryOps
from kernopt.shape.symbolic import Variable
from kernopt.uopgraph import RULES, UPat, bounds, graph_rewrite, linearize, simplifier
from kernopt.uops import UOp, UOps

I, F, B = dtypes.int32, dtypes.float, dtypes.bool
def c(v, dt=I): return UOp.const(dt, v)
def alu(op, *src, dt=None):
  return UOp(UOps.ALU, dt or (B if op in (BinaryOps.CMPLT, BinaryOps.CMPNE) else src[-1].dtype), src, op)
def rw(u): return graph_rewrite(u, simplifier)
def gidx(n=16, d=0): return UOp(UOps.SPECIAL, I, (), (d, f"gidx{d}", n))
def rng(n, axis, red=False): return UOp(UOps.RANGE, I, (c(0), c(n)), (axis, red))
BUF = UOp(UOps.DEFINE_GLOBAL, F, (), (0, "data0", True))
IN = UOp(UOps.DEFINE_GLOBAL, F, (), (1, "data1", False))
X = UOp(UOps.LOAD, F, (IN, gidx()))

def test_every_rule_has_a_named_function():
  assert all(isinstance(p, UPat) and fn.__name__ != "<lambda>" for p, fn in RULES)

def test_fold_alu():
  assert rw(alu(BinaryOps.ADD, c(2), c(3))) is c(5)
  assert rw(alu(BinaryOps.IDIV, c(-7), c(2))) is c(-3)                  # C truncation, from exec_alu
  assert rw(alu(BinaryOps.CMPLT, c(1.0, F), c(2.0, F))) is c(True, B)
  assert rw(alu(BinaryOps.ADD, c(2147483647), c(1))) is c(-2147483648)  # int32 wraps

def test_fold_cast():
  assert rw(UOp(UOps.CAST, F, (c(3),))) is c(3.0, F)
  assert rw(UOp(UOps.CAST, I, (c(-2.7, F),))) is c(-2)

def test_add_zero():
  assert rw(alu(BinaryOps.ADD, X, c(-0.0, F))) is X
  assert rw(alu(BinaryOps.ADD, X, c(0.0, F))).op is UOps.ALU    # -0.0 + 0.0 is +0.0, not x
  assert rw(alu(BinaryOps.ADD, c(0), gidx())) is gidx()

def test_mul_one():
  assert rw(alu(BinaryOps.MUL, X, c(1.0, F))) is X

def test_mul_zero_ints_only():
  assert rw(alu(BinaryOps.MUL, gidx(), c(0))) is c(0)
  assert rw(alu(BinaryOps.MUL, X, c(0.0, F))).op is UOps.ALU    # NaN * 0 is NaN

def test_div_one_and_mod_one():
  assert rw(alu(BinaryOps.IDIV, gidx(), c(1))) is gidx()
  assert rw(alu(BinaryOps.MOD, gidx(), c(1))) is c(0)

def test_where_const_and_where_same():
  assert rw(alu(TernaryOps.WHERE, c(True, B), X, c(0.0, F))) is X
  assert rw(alu(TernaryOps.WHERE, c(False, B), X, c(0.0, F))) is c(0.0, F)
  cond = alu(BinaryOps.CMPLT, gidx(), c(3))
  assert rw(alu(TernaryOps.WHERE, cond, X, X)) is X

def test_and_true():
  cond = alu(BinaryOps.CMPLT, gidx(), c(3))
  assert rw(alu(BinaryOps.AND, cond, c(True, B))) is cond
  assert rw(alu(BinaryOps.AND, cond, c(False, B))) is c(False, B)

def test_cmplt_bounds():
  assert rw(alu(BinaryOps.CMPLT, gidx(16), c(16))) is c(True, B)
  assert rw(alu(BinaryOps.CMPLT, gidx(16), c(0))) is c(False, B)
  assert rw(alu(BinaryOps.CMPLT, gidx(16), c(8))).op is UOps.ALU

def test_max_bounds():
  assert rw(alu(BinaryOps.MAX, gidx(16), c(-1))) is gidx(16)

def test_div_and_mod_small():
  assert rw(alu(BinaryOps.IDIV, gidx(4), c(4))) is c(0)
  assert rw(alu(BinaryOps.MOD, gidx(4), c(4))) is gidx(4)

def test_div_split_and_mod_split():
  g, l = gidx(16), gidx(4, 1)
  s = alu(BinaryOps.ADD, alu(BinaryOps.MUL, g, c(4)), l)               # g*4 + l, 0 <= l < 4
  assert rw(alu(BinaryOps.IDIV, s, c(4))) is g
  assert rw(alu(BinaryOps.MOD, s, c(4))) is l
  s8 = alu(BinaryOps.ADD, alu(BinaryOps.MUL, g, c(8)), gidx(8, 1))    # (g*8 + l)//4 -> g*2 + l//4
  assert rw(alu(BinaryOps.IDIV, s8, c(4))) is alu(BinaryOps.ADD, alu(BinaryOps.MUL, g, c(2)),
                                                  alu(BinaryOps.IDIV, gidx(8, 1), c(4)))
  neg = alu(BinaryOps.ADD, alu(BinaryOps.MUL, g, c(4)), c(-1))        # not when a part can be negative
  assert rw(alu(BinaryOps.IDIV, neg, c(4))).arg is BinaryOps.IDIV

def test_add_consts_and_mul_consts():
  assert rw(alu(BinaryOps.ADD, alu(BinaryOps.ADD, gidx(), c(2)), c(3))) is alu(BinaryOps.ADD, gidx(), c(5))
  assert rw(alu(BinaryOps.MUL, alu(BinaryOps.MUL, gidx(), c(2)), c(3))) is alu(BinaryOps.MUL, gidx(), c(6))

def test_load_valid():
  idx = alu(TernaryOps.WHERE, c(True, B), gidx(), c(0))
  assert rw(UOp(UOps.LOAD, F, (IN, gidx(), c(True, B), c(0.0, F)))) is X
  assert rw(UOp(UOps.LOAD, F, (IN, idx, c(False, B), c(0.0, F)))) is c(0.0, F)

def test_store_valid_and_dead_stores():
  st = UOp(UOps.STORE, None, (BUF, gidx(), X, c(True, B)))
  assert rw(st) is UOp(UOps.STORE, None, (BUF, gidx(), X))
  dead = UOp(UOps.STORE, None, (BUF, gidx(), X, alu(BinaryOps.CMPLT, gidx(), c(0))))
  assert rw(UOp(UOps.SINK, None, (dead, st))).src == (UOp(UOps.STORE, None, (BUF, gidx(), X)),)

def test_gep_vectorize():
  v = UOp(UOps.VECTORIZE, F.vec(2), (X, c(1.0, F)))
  assert rw(UOp(UOps.GEP, F, (v,), 1)) is c(1.0, F)

def test_bounds():
  r = rng(10, 1, True)
  assert bounds(r) == (0, 9)
  assert bounds(alu(BinaryOps.ADD, alu(BinaryOps.MUL, gidx(4), c(10)), r)) == (0, 39)
  assert bounds(alu(BinaryOps.MOD, alu(BinaryOps.ADD, r, c(5)), c(4))) == (0, 3)
  assert bounds(alu(BinaryOps.IDIV, r, c(4))) == (0, 2)
  assert bounds(UOp(UOps.DEFINE_VAR, I, (), Variable("n", 2, 7))) == (2, 7)
  assert bounds(alu(BinaryOps.MUL, gidx(1 << 20), c(1 << 20))) == (dtypes.min(I), dtypes.max(I))  # may wrap
  assert bounds(X) == (None, None)

def test_rewrite_reaches_a_fixpoint_in_new_nodes():
  # (g*4 + 3) // 4 -> g + 3//4 -> g + 0 -> g
  g = gidx()
  assert rw(alu(BinaryOps.IDIV, alu(BinaryOps.ADD, alu(BinaryOps.MUL, g, c(4)), c(3)), c(4))) is g

# ***** linearization *****

def _pos(uops, u): return next(i for i, x in enumerate(uops) if x is u)

def _reduce_kernel():
  # out[i] = sum_k in[i*8 + k] * w[k], C style: i is a loop (not reduce), k a reduce loop
  i, k = rng(4, 0), rng(8, 1, True)
  W = UOp(UOps.DEFINE_GLOBAL, F, (), (2, "data2", False))
  a = UOp(UOps.LOAD, F, (IN, alu(BinaryOps.ADD, alu(BinaryOps.MUL, i, c(8)), k)))
  w = UOp(UOps.LOAD, F, (W, k))
  acc = UOp(UOps.DEFINE_ACC, F, (k,), (0.0, 0))
  phi = UOp(UOps.PHI, F, (acc, alu(BinaryOps.ADD, acc, alu(BinaryOps.MUL, a, w))))
  out = alu(BinaryOps.MUL, phi, c(2.0, F))
  st = UOp(UOps.STORE, None, (BUF, i, out))
  return i, k, w, acc, phi, out, st

def test_loop_nesting_and_acc_placement():
  i, k, w, acc, phi, out, st = _reduce_kernel()
  uops = linearize(UOp(UOps.SINK, None, (st,)))
  p = lambda u: _pos(uops, u)  # noqa: E731
  ends = [j for j, u in enumerate(uops) if u.op is UOps.ENDRANGE]
  end_i = next(j for j in ends if uops[j].src[0] is i)
  end_k = next(j for j in ends if uops[j].src[0] is k)
  assert p(i) < p(acc) < p(k) < p(phi) < end_k < p(out) < p(st) < end_i   # acc re-initialized per output
  assert end_k < end_i and len(uops) == len(set(map(id, uops)))
  # the load of w depends only on k: inside k's loop; the store is after k's loop, inside i's
  assert p(k) < p(w) < end_k

def test_hoisting_loop_invariants():
  i, k = rng(4, 0), rng(8, 1, True)
  inv = alu(BinaryOps.MUL, i, c(8))                   # depends on i only: computed outside the k loop
  ld = UOp(UOps.LOAD, F, (IN, alu(BinaryOps.ADD, inv, k)))
  acc = UOp(UOps.DEFINE_ACC, F, (k,), (0.0, 0))
  phi = UOp(UOps.PHI, F, (acc, alu(BinaryOps.ADD, acc, ld)))
  uops = linearize(UOp(UOps.SINK, None, (UOp(UOps.STORE, None, (BUF, i, phi)),)))
  assert _pos(uops, i) < _pos(uops, inv) < _pos(uops, k)
  const_expr = alu(BinaryOps.MUL, X, c(3.0, F))       # no loop at all: before every loop
  uops = linearize(UOp(UOps.SINK, None, (UOp(UOps.STORE, None, (BUF, i, const_expr)),)))
  assert _pos(uops, const_expr) < _pos(uops, i)

def test_accumulator_read_inside_its_loop():
  """A use of an accumulator's running value (a WMMA's C operand: a VECTORIZE of accumulators) is computed in the
  accumulator's loop, each iteration, not hoisted before it."""
  i, k = rng(4, 0), rng(8, 1, True)
  accs = [UOp(UOps.DEFINE_ACC, F, (k,), (0.0, n)) for n in range(2)]
  c_vec = UOp(UOps.VECTORIZE, F.vec(2), tuple(accs))
  ld = UOp(UOps.LOAD, F.vec(2), (IN, alu(BinaryOps.ADD, alu(BinaryOps.MUL, i, c(16)), alu(BinaryOps.MUL, k, c(2)))))
  new = alu(BinaryOps.ADD, c_vec, ld)
  phis = [UOp(UOps.PHI, F, (a, UOp(UOps.GEP, F, (new,), n))) for n, a in enumerate(accs)]
  st = UOp(UOps.STORE, None, (BUF, i, alu(BinaryOps.ADD, *phis)))
  uops = linearize(UOp(UOps.SINK, None, (st,)))
  end_k = next(j for j, u in enumerate(uops) if u.op is UOps.ENDRANGE and u.src[0] is k)
  assert max(_pos(uops, a) for a in accs) < _pos(uops, k) < _pos(uops, c_vec) < end_k < _pos(uops, st)

def test_params_first_in_argument_order():
  n = UOp(UOps.DEFINE_VAR, I, (), Variable("n", 1, 9))
  m = UOp(UOps.DEFINE_VAR, I, (), Variable("m", 1, 9))
  v = alu(BinaryOps.ADD, UOp(UOps.LOAD, F, (IN, alu(BinaryOps.ADD, n, m))), X)
  uops = linearize(UOp(UOps.SINK, None, (UOp(UOps.STORE, None, (BUF, gidx(), v)),)))
  want = [(0, "data0", True), (1, "data1", False), Variable("m", 1, 9), Variable("n", 1, 9)]
  assert [u.arg for u in uops[:4]] == want

def test_guarded_store_gets_if_endif():
  gate = alu(BinaryOps.CMPLT, gidx(16), c(3))
  s1 = UOp(UOps.STORE, None, (BUF, gidx(16), X, gate))
  s2 = UOp(UOps.STORE, None, (BUF, alu(BinaryOps.ADD, gidx(16), c(16)), X, gate))
  uops = linearize(UOp(UOps.SINK, None, (s1, s2)))
  ops = [u.op for u in uops]
  assert ops.count(UOps.IF) == 1 and ops.count(UOps.ENDIF) == 1 and ops[-1] is UOps.ENDIF
  j = ops.index(UOps.IF)
  assert uops[j].src == (gate,) and all(u.op is UOps.STORE and len(u.src) == 3 for u in uops[j + 1:-1])

def test_sequential_loops_with_barrier():
  # stage 1: loop r1 into an acc, store to local, BARRIER, stage 2: loop r2 over the local buffer
  r1, r2 = rng(4, 2, True), rng(8, 1, True)
  lbuf = UOp(UOps.DEFINE_LOCAL, F, (), ("temp0", 8))
  acc1 = UOp(UOps.DEFINE_ACC, F, (r1,), (0.0, 0))
  phi1 = UOp(UOps.PHI, F, (acc1, alu(BinaryOps.ADD, acc1, UOp(UOps.LOAD, F, (IN, r1)))))
  lst = UOp(UOps.STORE, None, (lbuf, gidx(8, 1), phi1))
  bar = UOp(UOps.BARRIER, None, (lst,))
  acc2 = UOp(UOps.DEFINE_ACC, F, (r2,), (0.0, 1))
  phi2 = UOp(UOps.PHI, F, (acc2, alu(BinaryOps.ADD, acc2, UOp(UOps.LOAD, F, (lbuf, r2, bar)))))
  uops = linearize(UOp(UOps.SINK, None, (UOp(UOps.STORE, None, (BUF, c(0), phi2)),)))
  p = lambda u: _pos(uops, u)  # noqa: E731
  end1 = next(j for j, u in enumerate(uops) if u.op is UOps.ENDRANGE and u.src[0] is r1)
  assert p(r1) < p(phi1) < end1 < p(lst) < p(bar) < p(r2) < p(phi2)

# ***** the compiled matcher and the rewrite driver *****

def test_compiled_patterns_agree_with_upat_match():
  from kernopt.uopgraph import compile_upat
  g = gidx()
  nodes = [alu(BinaryOps.ADD, g, c(0)), alu(BinaryOps.ADD, c(0), g), alu(BinaryOps.ADD, g, g),
           alu(BinaryOps.MUL, g, c(1)),
           alu(BinaryOps.ADD, alu(BinaryOps.ADD, g, c(2)), c(3)), alu(BinaryOps.ADD, c(3), alu(BinaryOps.ADD, g, c(2))),
           alu(TernaryOps.WHERE, c(True, B), X, X), alu(BinaryOps.MAX, g, c(3)), X, c(1.5, F)]
  for pat, _ in RULES:
    m = compile_upat(pat)
    for u in nodes:
      want, got = {}, {}
      ok = pat.match(u, want)
      assert ok == m(u, got), (pat, u)
      if ok: assert want == got, (pat, u)   # the same captures (only a success's captures are used)

def test_commutative_pattern_with_const_first():
  # the source prefilter must not skip a rule whose CONST is the left operand
  g = gidx()
  assert rw(alu(BinaryOps.ADD, c(0), g)) is g
  assert rw(alu(BinaryOps.MUL, c(1), g)) is g

def test_shared_subgraph_rewritten_once_and_users_rebuilt():
  g = gidx()
  shared = alu(BinaryOps.ADD, alu(BinaryOps.ADD, g, c(1)), c(-1))   # -> g
  a, b = alu(BinaryOps.MUL, shared, c(3)), alu(BinaryOps.ADD, shared, c(5))
  root = UOp(UOps.SINK, None, (UOp(UOps.STORE, None, (BUF, a, X)), UOp(UOps.STORE, None, (BUF, b, X))))
  out = rw(root)
  st = out.src
  assert st[0].src[1] is alu(BinaryOps.MUL, g, c(3)) and st[1].src[1] is alu(BinaryOps.ADD, g, c(5))

def test_deep_chain_has_no_recursion_limit():
  x = X
  for i in range(3000): x = alu(BinaryOps.ADD, x, UOp(UOps.LOAD, F, (IN, c(i))))
  root = UOp(UOps.SINK, None, (UOp(UOps.STORE, None, (BUF, gidx(), x)),))
  assert rw(root) is root
  assert len(linearize(root)) > 3000

def test_toposort_is_cached_without_keeping_the_root_alive():
  import weakref
  from kernopt import uops as uops_mod
  from kernopt.uopgraph import toposort
  root = UOp(UOps.SINK, None, (UOp(UOps.STORE, None, (BUF, c(777001), X)),))
  first = toposort(root)
  assert toposort(root) == first and first[-1] is root and first[0] is BUF
  ref = weakref.ref(root)
  del root, first
  uops_mod._sweep(full=True)
  assert ref() is None   # the interned table let it go: the cached order doesn't refer back to the root
