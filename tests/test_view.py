"""View: canonicalisation in View.create, each movement op, reshapes of masked views, merging and minify."""
import numpy as np
import pytest
from kernopt.errors import ShapeError
from kernopt.shape.symbolic import NumNode, Variable, sym_infer
from kernopt.shape.view import View, merge_views, strides_for_shape, un1d

def view_map(v: View) -> np.ndarray:
  """The index of each element of v, -1 where invalid, by direct evaluation of the definition."""
  out = np.full(v.shape, -1, dtype=np.int64)
  for x in np.ndindex(*v.shape):
    if v.mask is None or all(b <= i < e for i, (b, e) in zip(x, v.mask)):
      out[x] = v.offset + sum(i * s for i, s in zip(x, v.strides))
  return out

def test_strides_for_shape():
  assert strides_for_shape((2, 3, 4)) == (12, 4, 1)
  assert strides_for_shape((2, 1, 4)) == (4, 0, 1)
  assert strides_for_shape((1,)) == (0,) and strides_for_shape(()) == ()
  assert un1d((2, 3, 4), 17) == [1, 1, 1]

def test_create_canonicalises():
  v = View.create((2, 3, 4))
  assert v.strides == (12, 4, 1) and v.offset == 0 and v.mask is None and v.contiguous
  assert View.create((2, 1, 4), (4, 7, 1)).strides == (4, 0, 1)
  assert View.create((2, 3), mask=((0, 2), (0, 3))).mask is None
  assert View.create((2, 3), mask=[[0, 2], [0, 3]]) == View.create((2, 3))
  assert View.create([2, 3]) is View.create((2, 3))
  assert not View.create((2, 3), offset=1).contiguous and not View.create((2, 3), (1, 2)).contiguous
  assert View.create((2, 3), (3, 1), 0, ((1, 2), (0, 3))) == View.create((2, 3), (0, 1), 3, ((1, 2), (0, 3)))
  empty = View.create((2, 3), (3, 1), 5, ((1, 1), (0, 3)))
  assert empty == View.create((2, 3), (7, 7), 9, ((0, 2), (2, 1))) and empty.all_masked()
  assert empty.strides == (0, 0) and empty.offset == 0 and empty.mask == ((0, 0), (0, 0))
  zero = View.create((3, 0), (5, 5), 4)
  assert zero.strides == (0, 0) and zero.offset == 0 and zero.contiguous and zero.size() == 0
  assert View.create((NumNode(2), 3)).shape == (2, 3)

def test_create_rejects_bad_shapes():
  with pytest.raises(ShapeError, match="-2"): View.create((3, -2))
  with pytest.raises(ShapeError, match="2.5"): View.create((3, 2.5))
  with pytest.raises(ShapeError, match="stride"): View.create((3, 2), (1,))
  assert View.create((np.int64(3), 2)).shape == (3, 2)

def test_permute():
  v = View.create((2, 3, 4)).permute((2, 0, 1))
  assert v.shape == (4, 2, 3) and v.strides == (1, 12, 4)
  assert np.array_equal(view_map(v), np.arange(24).reshape(2, 3, 4).transpose(2, 0, 1))
  m = View.create((2, 3), mask=((0, 1), (1, 3))).permute((1, 0))
  assert m.mask == ((1, 3), (0, 1))

def test_expand():
  v = View.create((3, 1)).expand((3, 5))
  assert v.strides == (1, 0) and v.shape == (3, 5)
  m = View.create((3, 1)).pad(((1, 0), (0, 0))).expand((4, 2))
  assert m.mask == ((1, 4), (0, 2)) and np.array_equal(view_map(m), np.broadcast_to([[-1], [0], [1], [2]], (4, 2)))
  with pytest.raises(ShapeError, match=r"expand.*\(3, 1\).*\(4, 1\)"): View.create((3, 1)).expand((4, 1))

def test_pad_and_shrink():
  v = View.create((2, 3)).pad(((1, 0), (2, 1)))
  assert v.shape == (3, 6) and v.offset == -5 and v.mask == ((1, 3), (2, 5))
  assert np.array_equal(view_map(v), np.pad(np.arange(6).reshape(2, 3), ((1, 0), (2, 1)), constant_values=-1))
  assert v.shrink(((1, 3), (2, 5))) == View.create((2, 3))
  assert View.create((2, 3)).pad(((0, 0), (0, 0))) == View.create((2, 3))
  s = View.create((4, 5)).shrink(((1, 3), (2, 4)))
  assert s.shape == (2, 2) and s.offset == 7 and s.strides == (5, 1)
  half = v.shrink(((0, 2), (0, 3)))
  assert half.mask == ((1, 2), (2, 3)) and np.array_equal(view_map(half), [[-1, -1, -1], [-1, -1, 0]])

def test_stride():
  v = View.create((4, 5)).stride((2, -1))
  assert v.shape == (2, 5) and v.strides == (10, -1) and v.offset == 4
  assert np.array_equal(view_map(v), np.arange(20).reshape(4, 5)[::2, ::-1])
  m = View.create((7,)).pad(((2, 1),)).stride((-3,))
  assert np.array_equal(view_map(m), np.pad(np.arange(7), (2, 1), constant_values=-1)[::-3])
  with pytest.raises(ShapeError, match="stride"): View.create((4, 5)).stride((2, 0))

def test_reshape_unmasked():
  v = View.create((4, 6)).permute((1, 0))
  assert v.reshape((3, 2, 4)) == View.create((3, 2, 4), (2, 1, 6))
  assert v.reshape((6, 1, 4)).strides == (1, 0, 6)
  assert v.reshape((24,)) is None and v.reshape((4, 6)) is None
  assert v.reshape((6, 4)) is v
  e = View.create((3, 1)).expand((3, 4))
  assert e.reshape((3, 2, 2)) == View.create((3, 2, 2), (1, 0, 0))
  assert e.reshape((12,)) is None
  with pytest.raises(ShapeError, match=r"reshape.*\(6, 4\).*\(5, 5\)"): v.reshape((5, 5))

def test_reshape_masked_views():
  padded = View.create((2, 3)).pad(((1, 1), (0, 0)))  # rows of zeros above and below: still rows after a reshape
  flat = padded.reshape((12,))
  assert flat is not None and flat.mask == ((3, 9),)
  want = np.pad(np.arange(6).reshape(2, 3), ((1, 1), (0, 0)), constant_values=-1)
  assert np.array_equal(view_map(flat), want.ravel())
  back = flat.reshape((4, 3))
  assert back == padded
  split = View.create((4,)).pad(((0, 4),)).reshape((2, 4))
  assert split is not None and split.mask == ((0, 1), (0, 4))
  assert View.create((3,)).pad(((1, 0),)).reshape((2, 2)) is None  # the valid part is not a box
  cols = View.create((2, 3)).pad(((0, 0), (1, 0)))
  assert cols.reshape((8,)) is None and cols.reshape((2, 2, 2)) is None
  one = View.create((4, 5)).shrink(((1, 2), (0, 5))).pad(((1, 1), (0, 0)))
  assert one.strides == (0, 1)  # one valid row: its stride moves into the offset
  for shape in ((15,), (3, 5, 1), (1, 3, 5)):
    r = one.reshape(shape)
    assert r is not None and np.array_equal(view_map(r), view_map(one).reshape(shape))

def test_reshape_all_masked():
  empty = View.create((2, 3)).shrink(((0, 0), (0, 3))).pad(((1, 1), (0, 0)))
  assert empty.all_masked() and empty.reshape((3, 2)) == View.create((3, 2), mask=((0, 0), (0, 0)))
  assert View.create((1,)).shrink(((0, 0),)).pad(((0, 1),)).reshape(()) is None

def test_merge_views():
  base = View.create((4, 6))
  assert merge_views(base, View.create((6, 4), (1, 6))) == View.create((6, 4), (1, 6))
  t = View.create((4, 6)).permute((1, 0))
  assert merge_views(t, View.create((6, 4))) == t and t + View.create((6, 4)) == t
  assert merge_views(t, View.create((3, 2, 4))) == View.create((3, 2, 4), (2, 1, 6))
  assert merge_views(t, View.create((24,))) is None
  shifted = merge_views(t, View.create((2, 4), (4, 1), 8))
  assert shifted is not None and np.array_equal(view_map(shifted), view_map(t).ravel()[8:16].reshape(2, 4))

def test_merge_masked_views():
  padded = View.create((4,)).pad(((2, 2),))
  merged = merge_views(padded, View.create((4, 2)))
  assert merged == View.create((4, 2), (2, 1), -2, ((1, 3), (0, 2)))
  upper = View.create((2, 3)).pad(((1, 0), (0, 0)))
  m = merge_views(View.create((12,)).shrink(((0, 6),)), upper)
  assert m is not None and np.array_equal(view_map(m), view_map(upper))
  lower_masked = View.create((3,)).pad(((1, 2),))  # 6 positions, valid 1..3
  picked = merge_views(lower_masked, View.create((2,), (3,), 1))  # positions 1 and 4
  assert picked is not None and np.array_equal(view_map(picked), [0, -1])

def test_minify():
  v = View.create((2, 3, 4))
  assert v.minify() == View.create((24,))
  t = View.create((2, 3, 4)).permute((2, 0, 1))
  assert t.minify() == View.create((4, 6), (1, 4))
  e = View.create((3, 1, 1)).expand((3, 4, 5))
  assert e.minify() == View.create((3, 20), (1, 0))

def test_expr():
  v = View.create((3, 4)).pad(((0, 0), (1, 0)))
  i, j = Variable("i", 0, 2), Variable("j", 0, 4)
  idx, valid = v.expr([i, j])
  for a in range(3):
    for b in range(5):
      assert sym_infer(valid, {i: a, j: b}) == int(b >= 1)
      if b >= 1: assert sym_infer(idx, {i: a, j: b}) == a * 4 + b - 1

def test_symbolic_view():
  n = Variable("n", 1, 10)
  v = View.create((n, 4))
  assert v.strides == (4, 1) and v.contiguous and v.size() == n * 4 and v.vars() == {n}
  assert v.reshape((n, 2, 2)) == View.create((n, 2, 2))
  p = v.permute((1, 0))
  assert p.strides == (1, 4) and p.reshape((2, 2, n)) == View.create((2, 2, n), (2, 1, 4))
  assert View.create((1, n)).expand((3, n)).strides == (0, 1)
  padded = v.pad(((1, 1), (0, 0)))
  assert padded.shape[0] == n + 2 and padded.mask == ((1, n + 1), (0, 4))
  assert padded.shrink(((1, n + 1), (0, 4))) == v
  with pytest.raises(ShapeError, match="reshape"): v.reshape((n, 5))

def test_unbind():
  n = Variable("n", 1, 10)
  View.create((n, 4)).reshape((n, 2, 2))  # cached unbound: the bound view below must not be served from it
  v = View.create((n.bind(3), 4))
  u, vals = v.unbind()
  assert vals == {n: 3} and all(x.val is None for x in u.vars())
  r = v.reshape((n.bind(3), 2, 2))
  assert r is not None and r.has_bound() and [x.val for x in r.vars()] == [3]
  assert View.create((2, 3)).unbind() == (View.create((2, 3)), {})

def _random_batch_pair(rng, b):
  """A lower view with a leading (symbolic) batch axis and an upper view that walks it batch by batch: the shapes a
  framework's symbolic batch dimension gives (expand, permute, pad and shrink of the per-batch part)."""
  inner_shape = tuple(int(x) for x in rng.integers(1, 4, size=rng.integers(1, 4)))
  lower = View.create((b,) + inner_shape)
  ops = rng.integers(0, 4, size=2)
  for op in ops:
    inner = lower.shape[1:]
    if op == 0 and len(inner) > 1: lower = lower.permute((0,) + tuple(int(x) + 1 for x in rng.permutation(len(inner))))
    elif op == 1: lower = lower.pad(((0, 0),) + tuple(tuple(int(x) for x in rng.integers(0, 2, size=2)) for _ in inner))
    elif op == 2: lower = lower.shrink(((0, b),) + tuple((0, max(1, s - int(rng.integers(0, 2)))) for s in inner))
  inner = tuple(lower.shape[1:])
  upper = View.create((b,) + inner)
  if rng.integers(0, 2) and len(inner) > 1:
    upper = upper.permute((0,) + tuple(int(x) + 1 for x in rng.permutation(len(inner))))
  if rng.integers(0, 3) == 0:   # read the per-batch part flat, or with a broadcast axis added
    n = int(np.prod(inner))
    upper = View.create((b, n)) if rng.integers(0, 2) else View.create((b, 1, n), (n, 0, 1))
  return lower, upper

def test_symbolic_batch_views_merge_and_agree_with_the_stack():
  """Views with a symbolic leading batch axis merge into one view like their int counterparts, and the merged view
  addresses the same elements as the two-view stack at every batch size (brute force against tests/ast_oracle)."""
  from ast_oracle import st_index
  from kernopt.shape.shapetracker import ShapeTracker
  b = Variable("batch", 1, 16)
  # the case a lazy tensor library met: a permuted, expanded per-batch part read again through a reshape
  st = ShapeTracker((View.create((b, 2, 8), (2, 1, 0)),)) + ShapeTracker((View.create((b, 1, 8, 2), (16, 0, 1, 8)),))
  assert len(st.views) == 1 and st.views[0].strides == (2, 0, 0, 1)
  rng = np.random.default_rng(0)
  merged = 0
  for _ in range(300):
    lower, upper = _random_batch_pair(rng, b)
    stacked = ShapeTracker((lower, upper))
    simple = ShapeTracker((lower,)) + ShapeTracker((upper,))
    merged += len(simple.views) == 1
    for n in (1, 3, 7):
      vv = {"batch": n}
      (f1, v1), (f2, v2) = st_index(stacked, vv), st_index(simple, vv)
      assert (v1 == v2).all(), (lower, upper, simple)
      assert (f1[v1] == f2[v2]).all(), (lower, upper, simple)
  assert merged > 150, merged
