"""ShapeTracker against numpy: random movement-op chains checked element by element (index and validity), the
stride/mask analyses against brute force over the index map, and unit tests of each op, simplify, symbolic shapes
and every ShapeError."""
import functools, math, random
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as hst
from kernopt.errors import ShapeError
from kernopt.shape.symbolic import AndNode, DivNode, LtNode, ModNode, MulNode, NumNode, SumNode, Variable, sym_infer
from kernopt.shape.shapetracker import ShapeTracker
from kernopt.shape.view import View

MAX_ELEMENTS = 3000
CHAINS_PER_EXAMPLE = 5  # hypothesis costs ~3 ms an example, more than a chain; so each example checks several
SETTINGS = settings(max_examples=2000 // CHAINS_PER_EXAMPLE, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ***** a numpy evaluator for index expressions: each idx{i} is an open grid along axis i *****

def evaluate(node, shape: tuple) -> np.ndarray:
  grids = {f"idx{i}": np.arange(s, dtype=np.int64).reshape([-1 if j == i else 1 for j in range(len(shape))])
           for i, s in enumerate(shape)}
  def ev(n):
    if isinstance(n, int): return n
    t = type(n)
    if t is NumNode: return n.b
    if t is Variable: return grids[n.expr]
    if t is MulNode: return ev(n.a) * ev(n.b)
    if t is DivNode: return ev(n.a) // ev(n.b)
    if t is ModNode: return ev(n.a) % ev(n.b)
    if t is LtNode: return (ev(n.a) < ev(n.b)).astype(np.int64)
    if t is SumNode: return sum(ev(x) for x in n.nodes)
    if t is AndNode: return functools.reduce(np.logical_and, [ev(x) != 0 for x in n.nodes]).astype(np.int64)
    raise AssertionError(f"unknown node {n!r}")
  return np.broadcast_to(np.asarray(ev(node), dtype=np.int64), shape)

# ***** random movement-op chains, applied to a tracker and to numpy side by side *****

def _divisors(n: int) -> list[int]: return [d for d in range(1, n + 1) if n % d == 0]

def random_reshape(draw, shape: tuple) -> tuple:
  mode = draw(0, 3)
  if mode == 0 and len(shape) >= 2:
    i = draw(0, len(shape) - 2)
    return shape[:i] + (shape[i] * shape[i + 1],) + shape[i + 2:]
  if mode == 1 and len(shape) < 6:
    i = draw(0, len(shape) - 1)
    ds = _divisors(shape[i])
    d = ds[draw(0, len(ds) - 1)]
    return shape[:i] + (d, shape[i] // d) + shape[i + 1:]
  if mode == 2:
    rest, out = math.prod(shape), []
    for _ in range(draw(0, 4)):
      ds = _divisors(rest)
      d = ds[draw(0, len(ds) - 1)]
      out.append(d)
      rest //= d
    out.append(rest)
    return tuple(out)
  if 1 in shape and len(shape) > 1 and draw(0, 1): return tuple(s for j, s in enumerate(shape) if j != shape.index(1))
  i = draw(0, len(shape))
  return shape[:i] + (1,) + shape[i:]

def random_op(draw, arr: np.ndarray) -> tuple[str, tuple]:
  shape, n = arr.shape, arr.size
  kind = ("reshape", "permute", "expand", "pad", "shrink", "stride")[draw(0, 5)]
  if kind == "expand" and 1 in shape:
    new = tuple(draw(1, 4) if s == 1 else s for s in shape)
    if math.prod(new) <= MAX_ELEMENTS: return kind, new
  if kind == "pad" and n > 0:  # numpy cannot pad an empty axis
    arg = tuple((draw(0, 2), draw(0, 2)) for _ in shape)
    if math.prod(s + b + e for s, (b, e) in zip(shape, arg)) <= MAX_ELEMENTS: return kind, arg
  if kind == "shrink":
    arg = []
    for s in shape:
      b = draw(0, s)
      arg.append((b, draw(b, s) if draw(0, 30) == 0 or b == s else draw(b + 1, s)))
    return kind, tuple(arg)
  if kind == "stride": return kind, tuple((draw(-3, 2) or 3) for _ in shape)
  if kind == "reshape" and n > 0: return kind, random_reshape(draw, shape)
  order = list(range(len(shape)))
  for i in range(len(order) - 1, 0, -1):
    j = draw(0, i)
    order[i], order[j] = order[j], order[i]
  return "permute", tuple(order)

def apply_numpy(arr: np.ndarray, kind: str, arg: tuple) -> np.ndarray:
  if kind == "reshape": return arr.reshape(arg)
  if kind == "permute": return arr.transpose(arg)
  if kind == "expand": return np.broadcast_to(arr, arg)
  if kind == "pad": return np.pad(arr, arg, constant_values=-1)
  if kind == "shrink": return arr[tuple(slice(b, e) for b, e in arg)]
  return arr[tuple(slice(None, None, m) for m in arg)]

BUF = [0]  # the buffer size of the last chain drawn

def random_chain(draw) -> tuple[ShapeTracker, np.ndarray, list]:
  shape = tuple(draw(1, 7) for _ in range(draw(1, 5)))
  while math.prod(shape) > MAX_ELEMENTS // 4: shape = shape[1:]
  st, arr, ops = ShapeTracker.from_shape(shape), np.arange(math.prod(shape)).reshape(shape), []
  BUF[0] = math.prod(shape)
  for _ in range(draw(1, 8)):
    kind, arg = random_op(draw, arr)
    ops.append((kind, arg))
    st, arr = getattr(st, kind)(arg), apply_numpy(arr, kind, arg)
  return st, arr, ops

def seeded_draw(seed: int):
  """Chains come from a seeded Random: hypothesis picks (and reports) the seed, which is much faster than drawing
  every choice through it."""
  return random.Random(seed).randint

def check_against_numpy(st: ShapeTracker, arr: np.ndarray, buffer_size: int) -> None:
  assert st.shape == arr.shape
  if arr.size == 0: return
  idx, valid = st.expr_idxs()
  iv, vv = evaluate(idx, arr.shape), evaluate(valid, arr.shape)
  invalid = arr == -1
  assert np.array_equal(vv, (~invalid).astype(np.int64)), f"validity differs for {st}"
  assert np.array_equal(iv[~invalid], arr[~invalid]), f"index differs for {st}"
  real = st.real_size()
  want = int(arr.max()) + 1 if not invalid.all() else 0
  assert want <= real <= buffer_size
  if len(st.simplify().views) == 1: assert real == want

def chains(seed: int):
  for k in range(CHAINS_PER_EXAMPLE): yield random_chain(seeded_draw(seed * CHAINS_PER_EXAMPLE + k))

def test_movement_chains_match_numpy():
  seen = []
  @SETTINGS
  @given(hst.integers(0, 2**32 - 1))
  def check(seed):
    for st, arr, ops in chains(seed):
      for t in (st, st.simplify()): check_against_numpy(t, arr, BUF[0])
      seen.append(len(ops))
  check()
  assert len(seen) >= 2000

def check_strides_and_masks(st: ShapeTracker, arr: np.ndarray) -> bool:
  """real_strides, unit_stride_axes and axis_is_masked against the index map; returns whether axis_is_masked
  over-reported (allowed only for trackers of several views, where validity is not always decidable)."""
  if arr.size == 0: return False
  valid, exact, over = arr != -1, len(st.simplify().views) == 1, False
  masked = [st.axis_is_masked(i) for i in range(arr.ndim)]
  for i in range(arr.ndim):
    depends = not np.array_equal(valid, np.broadcast_to(np.take(valid, [0], axis=i), valid.shape))
    assert masked[i] or not depends, f"axis {i}: validity depends on it but axis_is_masked is False for {st}"
    assert masked[i] == depends or not exact, f"axis {i}: axis_is_masked is True for {st}"
    over |= masked[i] and not depends
  for ignore_valid in (False, True):
    strides = st.real_strides(ignore_valid)
    assert len(strides) == arr.ndim
    assert st.unit_stride_axes(ignore_valid) == [i for i, s in enumerate(strides) if s == 1]
    for i, s in enumerate(strides):
      if s is None: continue
      assert ignore_valid or not masked[i], f"axis {i} is masked but has stride {s} in {st}"
      lo, hi = np.take(arr, range(0, arr.shape[i] - 1), axis=i), np.take(arr, range(1, arr.shape[i]), axis=i)
      both = (lo != -1) & (hi != -1)
      assert np.all((hi - lo)[both] == s), f"axis {i}: stride {s} is wrong for {st}"
  return over

def test_real_strides_and_masks_brute_force():
  seen, over = [], []
  @SETTINGS
  @given(hst.integers(0, 2**32 - 1))
  def check(seed):
    for st, arr, _ in chains(seed):
      over.append(check_strides_and_masks(st, arr))
      seen.append(len(st.views))
  check()
  assert len(seen) >= 2000
  # the symbolic layer cannot always see that a mask of an inner view never matters; keep that rare
  assert sum(over) <= len(seen) // 200

# ***** unit tests *****

def idx_map(st: ShapeTracker) -> np.ndarray:
  """The index map with -1 where invalid, for comparing trackers."""
  idx, valid = st.expr_idxs()
  return np.where(evaluate(valid, st.shape) != 0, evaluate(idx, st.shape), -1)

def test_from_shape():
  st = ShapeTracker.from_shape((2, 3, 4))
  assert st.shape == (2, 3, 4) and st.size == 24 and st.contiguous and st.consecutive and st.real_size() == 24
  assert st.views == (View.create((2, 3, 4)),)
  assert ShapeTracker.from_shape([2, 3]) == ShapeTracker.from_shape((2, 3))
  assert hash(ShapeTracker.from_shape((2, 3))) == hash(ShapeTracker.from_shape((2, 3)))

def test_each_op_matches_numpy():
  arr = np.arange(24).reshape(2, 3, 4)
  st = ShapeTracker.from_shape((2, 3, 4))
  for kind, arg in [("permute", (2, 0, 1)), ("pad", ((1, 0), (0, 2), (1, 1))), ("shrink", ((0, 4), (1, 3), (0, 4))),
                    ("stride", (-1, 2, 1)), ("reshape", (2, 8, 1)), ("expand", (2, 8, 3))]:
    st, arr = getattr(st, kind)(arg), apply_numpy(arr, kind, arg)
    assert np.array_equal(idx_map(st), arr), kind

def test_reshape_that_one_view_cannot_express_pushes_a_view():
  st = ShapeTracker.from_shape((4, 6)).permute((1, 0)).reshape((24,))
  assert len(st.views) == 2 and st.simplify() == st
  assert np.array_equal(idx_map(st), np.arange(24).reshape(4, 6).T.reshape(24))
  assert st.real_strides() == (None,)

def test_consecutive_vs_contiguous():
  st = ShapeTracker.from_shape((4, 6)).shrink(((1, 3), (0, 6)))
  assert st.consecutive and not st.contiguous and st.real_size() == 18

def test_simplify_merges_views():
  st = ShapeTracker.from_shape((4, 6)).reshape((2, 2, 6)).permute((1, 0, 2))
  st2 = ShapeTracker((View.create((4, 6)), View.create((2, 2, 6)))).permute((1, 0, 2))
  assert len(st2.views) == 2 and st2.simplify() == st
  padded = ShapeTracker((View.create((4,)).pad(((1, 1),)), View.create((3, 2))))
  assert np.array_equal(idx_map(padded), [[-1, 0], [1, 2], [3, -1]])
  assert padded.simplify() == padded  # the valid part is not a box of (3, 2)
  rows = ShapeTracker((View.create((4,)).pad(((2, 2),)), View.create((4, 2))))
  assert rows.simplify().views == (View.create((4, 2), (2, 1), -2, ((1, 3), (0, 2))),)
  three = ShapeTracker.from_shape((2, 3)).permute((1, 0)).reshape((6,)).reshape((2, 3)).permute((1, 0))
  assert three.simplify().views == three.views and len(three.views) == 2
  assert np.array_equal(idx_map(three), np.arange(6).reshape(2, 3).T.reshape(2, 3).T)

def test_add_composes_trackers():
  a = ShapeTracker.from_shape((4, 6)).permute((1, 0))
  b = ShapeTracker.from_shape((24,)).shrink(((4, 10),))
  assert np.array_equal(idx_map(a + b), np.arange(24).reshape(4, 6).T.reshape(24)[4:10])

def test_real_strides_and_unit_stride_axes():
  st = ShapeTracker.from_shape((4, 6)).permute((1, 0))
  assert st.real_strides() == (1, 6) and st.unit_stride_axes() == [0]
  padded = ShapeTracker.from_shape((4, 6)).pad(((0, 0), (1, 1)))
  assert padded.real_strides() == (6, None) and padded.real_strides(ignore_valid=True) == (6, 1)
  assert padded.unit_stride_axes() == [] and padded.unit_stride_axes(ignore_valid=True) == [1]
  assert not padded.axis_is_masked(0) and padded.axis_is_masked(1)
  expanded = ShapeTracker.from_shape((4, 1)).expand((4, 5))
  assert expanded.real_strides() == (1, 0) and expanded.views[-1].strides == (1, 0)
  merged = ShapeTracker.from_shape((8, 3)).reshape((2, 4, 3)).permute((1, 0, 2)).reshape((4, 6))
  assert merged.real_strides()[0] == 3

def test_real_strides_through_two_views():
  st = ShapeTracker.from_shape((3, 4)).permute((1, 0)).reshape((2, 6))
  assert len(st.views) == 2
  strides = st.real_strides()
  assert strides[1] is None and strides[0] in (None, 2)

def test_all_masked_tracker():
  st = ShapeTracker.from_shape((4, 5)).shrink(((1, 1), (0, 5))).pad(((2, 2), (0, 0)))
  assert st.shape == (4, 5) and st.real_size() == 0
  assert st.expr_idxs()[1] == NumNode(0) and not st.axis_is_masked(0)
  assert np.all(idx_map(st) == -1)

def test_zero_size():
  st = ShapeTracker.from_shape((3, 0))
  assert st.size == 0 and st.real_size() == 0 and st.reshape((0, 5)).shape == (0, 5)
  assert st.expr_idxs() == (NumNode(0), NumNode(0))

def test_expr_node_flat_index():
  st = ShapeTracker.from_shape((3, 4)).permute((1, 0))
  idx, valid = st.expr_node()
  assert valid == NumNode(1)
  flat = np.arange(12)
  env = {v: 0 for v in idx.vars()}
  got = [sym_infer(idx, {**env, **{v: int(f) for v in idx.vars()}}) for f in flat]
  assert got == list(np.arange(12).reshape(3, 4).T.reshape(12))

def test_expr_idxs_with_given_indices():
  st = ShapeTracker.from_shape((3, 4)).pad(((1, 0), (0, 0)))
  i, j = Variable("i", 0, 3), Variable("j", 0, 3)
  idx, valid = st.expr_idxs([i, j])
  assert {v.expr for v in idx.vars()} == {"i", "j"}
  assert sym_infer(valid, {i: 0, j: 2}) == 0 and sym_infer(valid, {i: 2, j: 2}) == 1
  assert sym_infer(idx, {i: 2, j: 3}) == 7
  idx, valid = st.expr_idxs([2, 3])
  assert idx == NumNode(7) and valid == NumNode(1)

# ***** symbolic shapes *****

N = Variable("n", 1, 10)

def test_symbolic_reshape_permute_expand():
  st = ShapeTracker.from_shape((N, 4))
  assert st.reshape((N, 2, 2)).views[-1].strides == (4, 2, 1)
  assert st.reshape((4 * N,)).contiguous
  p = st.permute((1, 0))
  assert p.shape == (4, N) and p.real_strides() == (1, 4)
  assert p.reshape((2, 2, N)).views[-1].strides == (2, 1, 4) and len(p.reshape((2, 2, N)).views) == 1
  e = ShapeTracker.from_shape((1, N)).expand((3, N))
  assert e.shape == (3, N) and e.views[-1].strides == (0, 1)
  with pytest.raises(ShapeError, match="reshape"): st.reshape((N, 3))

def test_symbolic_expr_idxs_after_binding():
  st = ShapeTracker.from_shape((N, 4)).permute((1, 0)).pad(((0, 0), (1, 0)))
  idx, valid = st.expr_idxs()
  for n in (1, 3, 10):
    arr = np.pad(np.arange(n * 4).reshape(n, 4).T, ((0, 0), (1, 0)), constant_values=-1)
    for (a, b), want in np.ndenumerate(arr):
      env = {N: n}
      env.update({v: (a if v.expr == "idx0" else b) for v in idx.vars() | valid.vars() if v.expr.startswith("idx")})
      assert sym_infer(valid, env) == int(want != -1)
      if want != -1: assert sym_infer(idx, env) == want

def test_symbolic_bind_and_unbind():
  bound = N.bind(5)
  st = ShapeTracker.from_shape((10,)).reshape((bound, 2))
  assert st.shape[0] == N and st.vars() == {N}
  unbound, vals = st.unbind()
  assert vals == {N: 5} and all(v.val is None for v in unbound.vars())
  assert sym_infer(st.size, {N: 5}) == 10

# ***** errors: each names the op and the shapes, and leaves the tracker as it was *****

BASE = ShapeTracker.from_shape((2, 3, 4))

@pytest.mark.parametrize("op,arg,match", [
  ("reshape", (5, 5), r"reshape.*\(2, 3, 4\).*\(5, 5\)"),
  ("reshape", (2, -3, -4), r"reshape.*-3"),
  ("reshape", (2, 3.0, 4), r"reshape.*3\.0"),
  ("reshape", 24, r"reshape.*not a sequence"),
  ("permute", (0, 1), r"permute.*\(0, 1\).*\(2, 3, 4\)"),
  ("permute", (0, 1, 1), r"permute.*\(0, 1, 1\)"),
  ("permute", (0, 1, 3), r"permute.*\(0, 1, 3\)"),
  ("shrink", ((0, 2), (0, 3), (0, 5)), r"shrink.*\(0, 5\).*\(2, 3, 4\)"),
  ("shrink", ((0, 2), (2, 1), (0, 4)), r"shrink.*begin > end"),
  ("shrink", ((0, 2), (0, 3)), r"shrink.*\(2, 3, 4\)"),
  ("shrink", ((-1, 2), (0, 3), (0, 4)), r"shrink.*-1"),
  ("pad", ((0, 0), (-1, 0), (0, 0)), r"pad.*-1"),
  ("pad", ((0, 0), (1, 0)), r"pad.*\(2, 3, 4\)"),
  ("pad", ((0, 0), (1, 0, 2), (0, 0)), r"pad.*\(2, 3, 4\)"),
  ("expand", (2, 6, 4), r"expand.*\(2, 3, 4\).*\(2, 6, 4\)"),
  ("expand", (2, 3), r"expand.*\(2, 3, 4\).*\(2, 3\)"),
  ("stride", (1, 0, 1), r"stride.*\(1, 0, 1\).*\(2, 3, 4\)"),
  ("stride", (1, 1), r"stride.*\(1, 1\)"),
  ("stride", (1, 1.5, 1), r"stride.*1\.5"),
])
def test_errors_name_op_and_shapes(op, arg, match):
  before = BASE.views
  with pytest.raises(ShapeError, match=match): getattr(BASE, op)(arg)
  assert BASE.views == before and BASE.shape == (2, 3, 4)

def test_error_cases_on_creation_and_queries():
  with pytest.raises(ShapeError, match=r"-1"): ShapeTracker.from_shape((2, -1))
  with pytest.raises(ShapeError, match=r"'a'"): ShapeTracker.from_shape((2, "a"))
  with pytest.raises(ShapeError, match="axis_is_masked.*5"): BASE.axis_is_masked(5)
  with pytest.raises(ShapeError, match="expr_idxs"): BASE.expr_idxs([Variable("i", 0, 1)])
  with pytest.raises(ShapeError): ShapeTracker(())
  with pytest.raises(ShapeError, match="expand"): ShapeTracker.from_shape((1, 3)).expand((2, 2))
