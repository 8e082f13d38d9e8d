import pickle
import numpy as np
import pytest
from kernopt.dtype import DType, ImageDType, dtypes, least_upper_dtype, least_upper_float, wrap_int

SCALARS = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32,
           dtypes.int64, dtypes.uint64, dtypes.half, dtypes.bfloat16, dtypes.float, dtypes.double]

@pytest.mark.parametrize("dt", [d for d in SCALARS if d.fmt is not None], ids=str)
def test_itemsize_and_format_agree_with_numpy(dt):
  assert np.dtype(dt.fmt).itemsize == dt.itemsize

def test_aliases():
  assert dtypes.half is dtypes.float16 and dtypes.float is dtypes.float32 and dtypes.double is dtypes.float64
  assert dtypes.uint is dtypes.uint32 and dtypes.long is dtypes.int64 and dtypes.char is dtypes.int8

def test_vectors():
  f4 = dtypes.float.vec(4)
  assert (f4.count, f4.itemsize, f4.scalar()) == (4, 16, dtypes.float)
  assert dtypes.float.vec(1) is dtypes.float and f4 == dtypes.float.vec(4) and hash(f4) == hash(dtypes.float.vec(4))
  with pytest.raises(ValueError, match="already a vector"): f4.vec(2)
  with pytest.raises(ValueError, match="positive"): dtypes.float.vec(0)

def test_images():
  img = dtypes.imagef((8, 16, 4))
  assert isinstance(img, ImageDType) and img.shape == (8, 16, 4)
  assert img.base == dtypes.float and img.scalar() == dtypes.float
  assert img == dtypes.imagef((8, 16, 4)) and img != dtypes.imagef((8, 8, 4)) and img != dtypes.imageh((8, 16, 4))
  assert img.name.startswith("image")

def test_predicates():
  assert all(dtypes.is_float(d) for d in (dtypes.half, dtypes.bfloat16, dtypes.float, dtypes.double))
  assert dtypes.is_int(dtypes.uint64) and dtypes.is_unsigned(dtypes.uint8) and not dtypes.is_unsigned(dtypes.int8)
  assert not dtypes.is_int(dtypes.bool) and not dtypes.is_float(dtypes.bool)
  assert dtypes.is_float(dtypes.float.vec(4))

# numpy's promotion agrees with the array-API lattice within a kind; across kinds (int with float) the lattice's
# least upper bound is the smallest float, where numpy picks a wider one, so those pairs are tested separately.
SAME_KIND = [(a, b) for a in SCALARS for b in SCALARS if a.fmt and b.fmt and dtypes.uint64 not in (a, b)
             and dtypes.is_float(a) == dtypes.is_float(b)]

@pytest.mark.parametrize("a,b", SAME_KIND, ids=str)
def test_promotion_matches_numpy_within_a_kind(a, b):
  assert np.dtype(least_upper_dtype(a, b).fmt) == np.promote_types(a.fmt, b.fmt)

def test_promotion_int_float_and_bfloat16():
  assert least_upper_dtype(dtypes.int32, dtypes.half) == dtypes.half
  assert least_upper_dtype(dtypes.half, dtypes.bfloat16) == dtypes.float
  assert least_upper_dtype(dtypes.uint64, dtypes.int64) == dtypes.half
  assert least_upper_float(dtypes.int8) == dtypes.float and least_upper_float(dtypes.half) == dtypes.half

@pytest.mark.parametrize("dt", [d for d in SCALARS if dtypes.is_int(d)], ids=str)
def test_limits_match_numpy(dt):
  info = np.iinfo(dt.fmt)
  assert (dtypes.min(dt), dtypes.max(dt)) == (info.min, info.max)
  assert wrap_int(info.max + 1, dt) == info.min and wrap_int(info.min - 1, dt) == info.max

def test_float_limits_and_consts():
  assert dtypes.min(dtypes.float) == -float("inf") and dtypes.max(dtypes.half) == float("inf")
  assert dtypes.as_const(300, dtypes.uint8) == 44 and dtypes.as_const(3, dtypes.float) == 3.0
  assert dtypes.as_const(2, dtypes.bool) is True

def test_pickle_and_lookup():
  for d in SCALARS + [dtypes.float.vec(4), dtypes.imageh((2, 2, 4))]:
    assert pickle.loads(pickle.dumps(d)) == d
  assert dtypes.from_name("float32") is dtypes.float and dtypes.from_name("half") is dtypes.half
  with pytest.raises(ValueError, match="unknown dtype"): dtypes.from_name("float7")
  assert isinstance(dtypes.fields()["int8"], DType)
