"""Index simplification through multi-View trackers (issue 18): the bounds that mask conditions imply
(shape/conditions.py: implied_bounds), the restriction of an index to them (restrict), and the trackers a framework's
padded convolution really builds (tinygrad 0.9.2's pad + _pool + conv2d movement ops: a padded, expanded, masked View
and a window View over it), also after the Kernel pads (PADTO) and splits (UPCAST) an axis. Every simplification is
checked by brute force over every point of the ranges: the index equals numpy's index arithmetic on every valid
element and the validity equals it everywhere; and the trackers' indices are affine (no // or %)."""
import itertools
import math
import random
import numpy as np
import ast_oracle
from test_shapetracker import apply_numpy, evaluate
from kernopt.kernel import Kernel, Opt, OptOps
from kernopt.ops import BinaryOps
from kernopt.runtime import Buffer, Device
from kernopt.shape.shapetracker import ShapeTracker
from kernopt.shape.conditions import count_divmod, implied_bounds, restrict
from kernopt.shape.symbolic import Node, NumNode, Variable

# ***** random affine conditions over a few small Variables, checked at every point *****

def _vars(rng: random.Random, n: int) -> list[Variable]:
  out = []
  for i in range(n):
    lo = rng.randint(-3, 2)
    out.append(Variable(f"v{i}", lo, lo + rng.randint(0, 6)))
  return out

def _affine(rng: random.Random, vs: list[Variable]) -> Node:
  return Node.sum([v * rng.choice((-3, -2, -1, 1, 1, 2, 4)) for v in rng.sample(vs, rng.randint(1, len(vs)))] +
                  [rng.randint(-5, 5)])

def _cond(rng: random.Random, vs: list[Variable]) -> tuple[Node, int, int]:
  x = _affine(rng, vs)
  b = rng.randint(x.min, x.max)
  return x, b, rng.randint(b + 1, x.max + 2)

def _points(vs: list[Variable]):
  for vals in itertools.product(*[range(v.min, v.max + 1) for v in vs]): yield dict(zip(vs, vals))

def _holds(conds, env) -> bool: return all(b <= x._eval(env) < e for x, b, e in conds)

def test_implied_bounds_hold_at_every_valid_point():
  rng = random.Random(1)
  narrowed = 0
  for _ in range(300):
    vs = _vars(rng, rng.randint(1, 3))
    conds = [_cond(rng, vs) for _ in range(rng.randint(1, 3))]
    bounds = implied_bounds(conds)
    narrowed += bool(bounds)
    for v, (lo, hi) in bounds.items(): assert v.min <= lo <= hi <= v.max
    for env in _points(vs):
      if _holds(conds, env): assert all(lo <= env[v] <= hi for v, (lo, hi) in bounds.items()), (conds, bounds, env)
  assert narrowed > 100   # the property is not vacuous

def test_implied_bounds_cases():
  x, y = Variable("x", 0, 31), Variable("y", 0, 7)
  assert implied_bounds([(x, 0, 12)]) == {x: (0, 11)}
  assert implied_bounds([(x * 8 + y, 0, 12)]) == {x: (0, 1)}           # an upcast lane y in [0, 7]
  assert implied_bounds([(x * -1 + 3, -40, 0)]) == {x: (4, 31)}        # 3 - x < 0
  assert implied_bounds([(x, 0, 4), (x, 8, 9)]) == {}                   # nothing satisfies both: nothing claimed
  assert implied_bounds([(x // 2, 0, 3)]) == {}                         # not affine: ignored

def test_restrict_is_exact_where_the_conditions_hold():
  """y (x over the narrowed and condition Variables), and y // d and y % d put back over x's own Variables, equal
  x, x // d and x % d at every point where the conditions hold."""
  rng = random.Random(2)
  fewer = 0
  for _ in range(300):
    vs = _vars(rng, rng.randint(2, 4))
    x = _affine(rng, vs)
    x = x - x.min   # the tracker divides non-negative flat positions
    conds = [_cond(rng, vs) for _ in range(rng.randint(1, 2))]
    if rng.random() < 0.5:  # a condition on a part of x, as a mask on an axis of the view above
      part = Node.sum([t for t in x.nodes[:2]]) if hasattr(x, "nodes") and len(x.nodes) > 2 else x
      conds.append((part, part.min, rng.randint(part.min + 1, part.max + 1)))
    r = restrict(x, conds)
    if r is None: continue
    y, back = r
    d = rng.randint(2, 9)
    outs = [(x, y.substitute(back)), (x // d, (y // d).substitute(back)), (x % d, (y % d).substitute(back))]
    fewer += count_divmod(outs[1][1]) + count_divmod(outs[2][1]) < count_divmod(outs[1][0]) + count_divmod(outs[2][0])
    for env in _points(vs):
      if not _holds(conds, env): continue
      for want, got in outs: assert got._eval(env) == want._eval(env), (x, conds, d, got, env)
  assert fewer > 30

def test_restrict_turns_a_condition_into_a_variable():
  i, u = Variable("i", 0, 7), Variable("u", 0, 3)
  x = i * 48 + u * 12 + 5   # a mask 4*i + u < 10 on the axis (4*i + u) whose stride is 12
  y, back = restrict(x, [(i * 4 + u, 0, 10)])
  assert count_divmod(((x // 12) % 12)) > 0
  assert ((y // 12) % 12).substitute(back) == i * 4 + u

# ***** the trackers of a framework's padded convolution *****

def _ceildiv(a: int, b: int) -> int: return -(-a // b)

def tinygrad_conv_input(n: int, cin: int, h: int, w: int, cout: int, k: tuple[int, int], stride: int, dilation: int,
                        pad: int) -> tuple[tuple[int, ...], list]:
  """The movement ops tinygrad 0.9.2's conv2d applies to its input (Tensor.pad2d, Tensor._pool, then the reshape /
  expand / permute onto (bs, groups, cout, oy, ox, cin, ky, kx)), groups = 1. Returns the input shape and the ops."""
  ops: list = [("pad", ((0, 0), (0, 0), (pad, pad), (pad, pad)))]
  i_ = (h + 2 * pad, w + 2 * pad)
  s_, d_ = (stride, stride), (dilation, dilation)
  if any(kk > s for kk, s in zip(k, s_)) or dilation != 1:
    o_ = [(i - d * (kk - 1) - 1) // s + 1 for i, d, kk, s in zip(i_, d_, k, s_)]
    e_ = [_ceildiv(kk * (i + d), i) for kk, i, d in zip(k, i_, d_)]
    ops += [("reshape", (n, cin, 1, i_[0], 1, i_[1])), ("expand", (n, cin, e_[0], i_[0], e_[1], i_[1])),
            ("reshape", (n, cin, e_[0] * i_[0], e_[1] * i_[1])),
            ("shrink", ((0, n), (0, cin), (0, k[0] * (i_[0] + d_[0])), (0, k[1] * (i_[1] + d_[1])))),
            ("reshape", (n, cin, k[0], i_[0] + d_[0], k[1], i_[1] + d_[1])),
            ("shrink", ((0, n), (0, cin), (0, k[0]), (0, o_[0] * s_[0]), (0, k[1]), (0, o_[1] * s_[1]))),
            ("reshape", (n, cin, k[0], o_[0], s_[0], k[1], o_[1], s_[1])),
            ("shrink", ((0, n), (0, cin), (0, k[0]), (0, o_[0]), (0, 1), (0, k[1]), (0, o_[1]), (0, 1))),
            ("reshape", (n, cin, k[0], o_[0], k[1], o_[1])), ("permute", (0, 1, 3, 5, 2, 4))]
  else:
    o_ = [(i + (s - kk)) // s for i, s, kk in zip(i_, s_, k)]
    ops += [("pad", ((0, 0), (0, 0), *[(0, max(0, o * s - i)) for o, s, i in zip(o_, s_, i_)])),
            ("shrink", ((0, n), (0, cin), *[(0, o * s) for o, s in zip(o_, s_)])),
            ("reshape", (n, cin, o_[0], s_[0], o_[1], s_[1])),
            ("shrink", ((0, n), (0, cin), (0, o_[0]), (0, k[0]), (0, o_[1]), (0, k[1]))),
            ("permute", (0, 1, 2, 4, 3, 5))]
  ops += [("reshape", (n, 1, cin, 1, o_[0], o_[1], k[0], k[1])),
          ("expand", (n, 1, cin, cout, o_[0], o_[1], k[0], k[1])), ("permute", (0, 1, 3, 4, 5, 2, 6, 7))]
  return (n, cin, h, w), ops

def _apply(shape: tuple[int, ...], ops: list) -> tuple[ShapeTracker, np.ndarray]:
  st, arr = ShapeTracker.from_shape(shape), np.arange(math.prod(shape)).reshape(shape)
  for kind, arg in ops: st, arr = getattr(st, kind)(arg), apply_numpy(arr, kind, arg)
  return st, arr

def _check_exact_and_affine(st: ShapeTracker, arr: np.ndarray) -> None:
  idx, valid = st.expr_idxs()
  assert count_divmod(idx) == 0 and count_divmod(valid) == 0, f"{st}: {idx} / {valid}"
  iv, vv, invalid = evaluate(idx, arr.shape), evaluate(valid, arr.shape), arr == -1
  assert np.array_equal(vv, (~invalid).astype(np.int64)), f"validity differs for {st}"
  assert np.array_equal(iv[~invalid], arr[~invalid]), f"index differs for {st}"

def _kernel_ops(rng: random.Random, shape: tuple[int, ...]) -> list:
  """What the Kernel's Opts do to a tracker: PADTO (pad an axis at its end) and UPCAST / UNROLL (split an axis in
  two, the inner part moved last)."""
  ops: list = []
  shape = list(shape)
  for _ in range(rng.randint(1, 2)):
    ax = rng.choice([i for i, s in enumerate(shape) if s > 1] or [0])
    if rng.random() < 0.5:
      extra = rng.randint(1, 5)
      ops.append(("pad", tuple((0, extra) if i == ax else (0, 0) for i in range(len(shape)))))
      shape[ax] += extra
    divs = [d for d in range(2, shape[ax] + 1) if shape[ax] % d == 0]
    if divs:
      d = rng.choice(divs)
      shape = shape[:ax] + [shape[ax] // d, d] + shape[ax + 1:]
      ops.append(("reshape", tuple(shape)))
      order = [i for i in range(len(shape)) if i != ax + 1] + [ax + 1]
      ops.append(("permute", tuple(order)))
      shape = [shape[i] for i in order]
  return ops

def _conv_case(rng: random.Random) -> tuple[tuple[int, ...], list]:
  while True:
    k, h, w, dil, pad = (rng.randint(1, 3), rng.randint(1, 3)), rng.randint(3, 7), rng.randint(3, 7), \
      rng.choice((1, 1, 2)), rng.randint(0, 2)
    if min(h, w) + 2 * pad > dil * (max(k) - 1): break   # at least one output position
  return tinygrad_conv_input(rng.randint(1, 2), rng.randint(1, 3), h, w, rng.randint(1, 2), k, rng.randint(1, 3), dil,
                             pad)

def test_reference_conv_trackers_are_affine_and_exact():
  rng = random.Random(3)
  for _ in range(120):
    shape, ops = _conv_case(rng)
    st, arr = _apply(shape, ops)
    _check_exact_and_affine(st, arr)

def test_padded_and_split_conv_trackers_stay_affine_and_exact():
  rng = random.Random(4)
  views = []
  for _ in range(120):
    shape, ops = _conv_case(rng)
    st, arr = _apply(shape, ops)
    st, arr = _apply(shape, ops + _kernel_ops(rng, arr.shape))
    views.append(len(st.views))
    _check_exact_and_affine(st, arr)
  assert max(views) >= 3   # some cases need a third View (a split of a padded axis)

def test_the_reference_conv_with_padto_renders_no_division_and_runs_right():
  """The reference's padded conv (benchmarks/asts/reference/conv_small_s1_0.json) with a PADTO and an UPCAST of the
  padded axis: before, its input index kept % 12 and // 48; now no IDIV or MOD is lowered, and the kernel matches the
  independent evaluator."""
  import kernopt
  from kernopt.renderers import get_renderer
  from kernopt.uops import UOps
  path = __file__.rsplit("/", 2)[0] + "/benchmarks/asts/reference/conv_small_s1_0.json"
  ast = kernopt.load(path)
  k = Kernel(ast, opts=get_renderer("CPU"))
  for o in (Opt(OptOps.PADTO, 2, 32), Opt(OptOps.UPCAST, 2, 4)): k.apply_opt(o)
  prg = k.to_program()
  assert not [u for u in prg.uops if u.op is UOps.ALU and u.arg in (BinaryOps.IDIV, BinaryOps.MOD)]
  dev = Device["CPU"]
  rng = np.random.default_rng(0)
  arrays = {a.idx: rng.standard_normal(a.min_size).astype(np.float32) if a.idx else np.zeros(a.min_size, np.float32)
            for a in prg.args}
  bufs = {a.idx: Buffer(dev, a.min_size, a.dtype).copyin(arrays[a.idx]) for a in prg.args}
  dev.compile(prg)(*[bufs[a.idx] for a in prg.args], wait=True)
  ev = ast_oracle.evaluate(ast, {i: a for i, a in arrays.items() if i}, {0: arrays[0]})
  np.testing.assert_allclose(bufs[0].numpy(), ev.buffers[0], rtol=1e-4, atol=1e-4 * max(1.0, ev.scale[0]))

def test_validity_only_narrows_unmasked_axes_never():
  # an axis without a mask keeps its own Variable: the index of a padded 1-D window stays over idx0 and idx1
  st = ShapeTracker.from_shape((6,)).pad(((1, 1),)).reshape((8, 1)).expand((8, 3))
  idx, valid = st.expr_idxs()
  assert idx.vars() <= {Variable("idx0", 0, 7)} and isinstance(valid, Node) and valid != NumNode(1)
