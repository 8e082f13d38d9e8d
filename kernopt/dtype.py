"""Scalar, vector and image data types, and type promotion. Imports nothing from kernopt."""
from __future__ import annotations
import builtins, math
from dataclasses import dataclass
from typing import Final, Optional, Union

ConstType = Union[float, int, bool]

@dataclass(frozen=True, order=True)
class DType:
  """A scalar type (count == 1) or a vector of `count` scalars. `fmt` is the struct/numpy format character."""
  priority: int
  itemsize: int
  name: str
  fmt: Optional[str]
  count: int = 1

  def __repr__(self) -> str:
    if self.count > 1 and _by_name.get(self._scalar_name) is None: return f"DType({self.name!r}, count={self.count})"
    scalar = _field_names.get(self.scalar(), self.name) if self.count > 1 else _field_names.get(self, self.name)
    return f"dtypes.{scalar}" if self.count == 1 else f"dtypes.{scalar}.vec({self.count})"
  @property
  def _scalar_name(self) -> str: return self.name[:-len(str(self.count))] if self.count > 1 else self.name

  def vec(self, n: int) -> DType:
    """The vector of n of this scalar type; vec(1) is the scalar itself."""
    if self.count != 1: raise ValueError(f"can't vectorize {self}: it is already a vector")
    if n == 1: return self
    if n < 1: raise ValueError(f"vector width must be positive, got {n}")
    return DType(self.priority, self.itemsize * n, f"{self.name}{n}", None, n)

  def scalar(self) -> DType:
    """The element type of a vector (a scalar returns itself)."""
    return self if self.count == 1 else _by_name[self._scalar_name]

@dataclass(frozen=True, repr=False)
class ImageDType(DType):
  """A 2-D image of RGBA texels: `shape` is (height, width, 4); `base` is the element type in memory."""
  shape: tuple[int, ...] = ()
  base: DType = None  # type: ignore[assignment]

  def __repr__(self) -> str: return f"dtypes.{self.name}({self.shape})"
  def scalar(self) -> DType: return self.base
  def vec(self, n: int) -> DType: raise ValueError(f"can't vectorize image type {self}")

def _dt(priority: int, itemsize: int, name: str, fmt: Optional[str]) -> DType:
  return DType(priority, itemsize, name, fmt, 1)

class dtypes:
  """The namespace of every scalar type, plus predicates, promotion and limits."""
  bool: Final[DType] = _dt(0, 1, "bool", "?")
  int8: Final[DType] = _dt(1, 1, "char", "b")
  uint8: Final[DType] = _dt(2, 1, "unsigned char", "B")
  int16: Final[DType] = _dt(3, 2, "short", "h")
  uint16: Final[DType] = _dt(4, 2, "unsigned short", "H")
  int32: Final[DType] = _dt(5, 4, "int", "i")
  uint32: Final[DType] = _dt(6, 4, "unsigned int", "I")
  int64: Final[DType] = _dt(7, 8, "long", "q")
  uint64: Final[DType] = _dt(8, 8, "unsigned long", "Q")
  float16: Final[DType] = _dt(9, 2, "half", "e")
  bfloat16: Final[DType] = _dt(10, 2, "bfloat16", None)
  float32: Final[DType] = _dt(11, 4, "float", "f")
  float64: Final[DType] = _dt(12, 8, "double", "d")
  # aliases
  half, float, double = float16, float32, float64
  uchar, ushort, uint, ulong = uint8, uint16, uint32, uint64
  char, short, int, long = int8, int16, int32, int64
  default_float: Final[DType] = float32
  default_int: Final[DType] = int32

  @staticmethod
  def is_float(x: DType) -> builtins.bool: return x.scalar() in _floats
  @staticmethod
  def is_int(x: DType) -> builtins.bool: return x.scalar() in _ints
  @staticmethod
  def is_unsigned(x: DType) -> builtins.bool: return x.scalar() in _unsigned
  @staticmethod
  def fields() -> dict[str, DType]: return dict(_fields)
  @staticmethod
  def from_name(name: str) -> DType:
    """A scalar type by its field name ('float32', 'half', ...) or its C-style name ('float', 'unsigned char')."""
    if name in _fields: return _fields[name]
    if name in _by_name: return _by_name[name]
    raise ValueError(f"unknown dtype name {name!r}")

  @staticmethod
  def imageh(shape: tuple[builtins.int, ...]) -> ImageDType: return _image(shape, dtypes.half, "imageh")
  @staticmethod
  def imagef(shape: tuple[builtins.int, ...]) -> ImageDType: return _image(shape, dtypes.float32, "imagef")

  @staticmethod
  def min(dt: DType) -> ConstType:
    """The smallest value of dt (-inf for floats)."""
    dt = dt.scalar()
    if dt == dtypes.bool: return False
    if dtypes.is_unsigned(dt): return 0
    if dtypes.is_int(dt): return -(1 << (8 * dt.itemsize - 1))
    return -math.inf

  @staticmethod
  def max(dt: DType) -> ConstType:
    """The largest value of dt (inf for floats)."""
    dt = dt.scalar()
    if dt == dtypes.bool: return True
    if dtypes.is_unsigned(dt): return (1 << (8 * dt.itemsize)) - 1
    if dtypes.is_int(dt): return (1 << (8 * dt.itemsize - 1)) - 1
    return math.inf

  @staticmethod
  def as_const(val: ConstType, dt: DType) -> ConstType:
    """val converted to the Python type that represents dt's values (ints wrap to dt's range)."""
    dt = dt.scalar()
    if dt == dtypes.bool: return bool(val)
    if dtypes.is_int(dt): return wrap_int(int(val), dt)
    return float(val)

def _image(shape: tuple[int, ...], base: DType, name: str) -> ImageDType:
  return ImageDType(100, 4, name, None, 1, tuple(shape), base)

def wrap_int(x: int, dt: DType) -> int:
  """x reduced to dt's range with two's-complement wrap-around."""
  bits = 8 * dt.itemsize
  x &= (1 << bits) - 1
  if not dtypes.is_unsigned(dt) and x >= 1 << (bits - 1): x -= 1 << bits
  return x

_fields: dict[str, DType] = {k: v for k, v in vars(dtypes).items()
                             if isinstance(v, DType) and not k.startswith("default")}
# the canonical field name of each type (the first one declared: float16 before its alias half)
_field_names: dict[DType, str] = {}
for _k, _v in _fields.items(): _field_names.setdefault(_v, _k)
_by_name: dict[str, DType] = {v.name: v for v in _fields.values()}
_floats = frozenset((dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64))
_unsigned = frozenset((dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64))
_ints = frozenset((dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64)) | _unsigned

# the promotion lattice: each type points at the types it promotes to without loss (as in the array API)
_promo: dict[DType, tuple[DType, ...]] = {
  dtypes.bool: (dtypes.int8, dtypes.uint8), dtypes.int8: (dtypes.int16,), dtypes.int16: (dtypes.int32,),
  dtypes.int32: (dtypes.int64,), dtypes.int64: (dtypes.float16, dtypes.bfloat16),
  dtypes.uint8: (dtypes.int16, dtypes.uint16), dtypes.uint16: (dtypes.int32, dtypes.uint32),
  dtypes.uint32: (dtypes.int64, dtypes.uint64), dtypes.uint64: (dtypes.float16, dtypes.bfloat16),
  dtypes.float16: (dtypes.float32,), dtypes.bfloat16: (dtypes.float32,), dtypes.float32: (dtypes.float64,),
  dtypes.float64: (),
}

def _uppers(dt: DType) -> frozenset[DType]:
  return frozenset((dt,)).union(*(_uppers(u) for u in _promo[dt]))

def least_upper_dtype(*ds: DType) -> DType:
  """The smallest type every one of ds promotes to (lowest priority among their common upper bounds)."""
  if not ds: raise ValueError("least_upper_dtype needs at least one dtype")
  common = frozenset.intersection(*(_uppers(d.scalar()) for d in ds))
  return min(common, key=lambda d: d.priority)

def least_upper_float(dt: DType) -> DType:
  return dt if dtypes.is_float(dt) else least_upper_dtype(dt, dtypes.float32)

_scalars = frozenset(_fields.values())

def storage_dtype_error(dt: object) -> Optional[str]:
  """None when dt can be a buffer's or constant's dtype (one of dtypes' scalars or a vector of one, or an image of a
  float scalar); else why not."""
  if type(dt) is DType:
    try:
      if dt in _scalars: return None
    except TypeError: return "a DType with unhashable fields is not one of kernopt's dtypes"
    if type(dt.count) is int and 1 < dt.count <= 256 and (sc := _by_name.get(dt._scalar_name)) in _scalars and \
       dt == sc.vec(dt.count): return None
    return f"DType(name={dt.name!r}, count={dt.count!r}) is not one of kernopt's dtypes (nor a vector of one)"
  if isinstance(dt, ImageDType):
    ok = dt.base in _floats and type(dt.shape) is tuple and len(dt.shape) == 3 and dt.shape[2] == 4 and \
      all(type(s) is int and s > 0 for s in dt.shape)
    return None if ok else f"image dtype {dt.name!r} {dt.shape!r} is not (height, width, 4) float texels"
  return f"{type(dt).__name__} {dt!r} is not a DType (e.g. dtypes.float)"
