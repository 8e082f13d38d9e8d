"""Symbolic integers for shapes and index/validity expressions: immutable nodes with exact integer bounds, simplified
on construction. `a // b` and `a % b` are floor division and modulo by a positive divisor (an int > 0, or a Node whose
min > 0); a numerator that may be negative is first shifted, (a + k*b)//b - k, so the tree only ever divides
non-negative numerators and a renderer may emit C's truncating `/` and `%`. A divisor that may be <= 0 raises
ShapeError. Sums and products are kept in one canonical order (`_order`), so equal expressions compare and hash
equal however they were built (a+b == b+a, (a*b)*c == a*(c*b)). Imports only kernopt.errors."""
from __future__ import annotations
import operator
from math import gcd
from typing import Any, Callable, Iterable, Optional, Union
from kernopt.errors import ShapeError

RenderOps = dict[type, Callable[..., Any]]

def _ceildiv(a: int, b: int) -> int: return -(-a // b)

def _sint(x: Any, op: str) -> Union[int, Node]:
  """int, or a Node that is not a constant (a constant Node becomes its int)."""
  if isinstance(x, Node): return x.min if x.min == x.max else x
  if isinstance(x, int): return int(x)
  raise ShapeError(f"symbolic {op} expects an int or a Node, got {type(x).__name__} {x!r}")

def _merge_terms(terms: list[Node], bases: list[Node]) -> list[Node]:
  """Add the coefficients of terms with the same base; a term left alone is kept as it was."""
  acc: dict[Node, list] = {}
  for t, base in zip(terms, bases):
    e = acc.get(base)
    if e is None: acc[base] = [t.b if base is not t else 1, t]  # type: ignore
    else: e[0], e[1] = e[0] + (t.b if base is not t else 1), None  # type: ignore
  return [t if t is not None else base if c == 1 else MulNode(base, c) for base, (c, t) in acc.items() if c]

def _add(a: Node, b: sint) -> Node:
  """a + b with a fast path for adding an int."""
  if type(b) is not int: return Node.sum([a, _sint(b, "+")])
  if b == 0: return a
  if a.min == a.max: return NumNode(a.min + b)
  if type(a) is not SumNode: return SumNode((a, NumNode(b)))
  *ts, last = a.nodes
  if type(last) is not NumNode: return SumNode((*a.nodes, NumNode(b)))
  if last.b + b: return SumNode((*ts, NumNode(last.b + b)))
  return SumNode(ts) if len(ts) > 1 else ts[0]

def _split(t: Node) -> tuple[Node, int]:
  """t == base * coefficient with an int coefficient."""
  return (t.a, t.b) if type(t) is MulNode and type(t.b) is int else (t, 1)

_RANK: dict[type, int] = {}   # type -> its place in the canonical order, filled in below the classes

def _order(n: Any) -> tuple:
  """A total, structural and process-independent sort key of a Node or int (hashes of str are salted per process,
  so they can't order what is rendered): a tuple led by the node type's rank, cached on the node."""
  if type(n) is int: return (0, n)
  try: return n._ord
  except AttributeError: pass
  t = type(n)
  if t is NumNode: k: tuple = (0, n.b)
  elif t is Variable: k = (1, n.expr, n.min, n.max)
  elif isinstance(n, _BinNode): k = (_RANK[t], _order(n.a), _order(n.b))
  else: k = (_RANK[t], tuple(_order(x) for x in n.nodes))
  n._ord = k
  return k

def _term_order(t: Node) -> tuple:
  """A sum's terms sort by base, then coefficient: x, x*2 and y*3 are ordered as x, y."""
  if type(t) is MulNode and type(t.b) is int: return (_order(t.a), t.b)
  return (_order(t), 1)

class Node:
  """A symbolic integer. `==` is structural (a Node equals an int only when it is a NumNode of that value)."""
  __slots__ = ("min", "max", "_hash", "_key", "_ord")
  min: int
  max: int
  _hash: int
  _key: Optional[str]

  def _fields(self) -> tuple: raise NotImplementedError
  def __hash__(self) -> int: return self._hash
  def __eq__(self, other: object) -> bool:
    if self is other: return True
    return type(other) is type(self) and self._hash == other._hash and self._fields() == other._fields()
  def __repr__(self) -> str: return f"<{self.render(ctx='DEBUG')}>"

  def render(self, ops: Optional[RenderOps] = None, ctx: Any = None) -> Any:
    """With ops None, a C-like string (cached as .key when ctx is None too). Otherwise ops[type(node)](node, ops, ctx),
    each function rendering its children with child.render(ops, ctx); int fields (MulNode.b, ...) stay ints."""
    if ops is None: ops = STR_OPS
    if ops is STR_OPS and ctx is None:
      if self._key is None: self._key = STR_OPS[type(self)](self, STR_OPS, None)
      return self._key
    return ops[type(self)](self, ops, ctx)
  @property
  def key(self) -> str: return self.render()

  def vars(self) -> set[Variable]:
    out: set[Variable] = set()
    stack: list[Node] = [self]
    while stack:
      n = stack.pop()
      if type(n) is Variable: out.add(n)
      elif isinstance(n, _ListNode): stack.extend(n.nodes)
      elif isinstance(n, _BinNode):
        stack.append(n.a)
        if isinstance(n.b, Node): stack.append(n.b)
    return out
  def substitute(self, var_vals: dict[Variable, Union[Node, int]]) -> Node: raise NotImplementedError
  def _eval(self, env: dict[Variable, int]) -> int: raise NotImplementedError

  def __add__(self, b: sint) -> Node: return _add(self, b)
  def __radd__(self, b: sint) -> Node: return _add(self, b)
  def __sub__(self, b: sint) -> Node: return _add(self, -b if type(b) is int else -_sint(b, "-"))
  def __rsub__(self, b: sint) -> Node: return _add(-self, b)
  def __neg__(self) -> Node: return _mul(self, -1)
  def __mul__(self, b: sint) -> Node: return _mul(self, _sint(b, "*"))
  def __rmul__(self, b: sint) -> Node: return _mul(self, _sint(b, "*"))
  def __floordiv__(self, b: sint) -> Node: return _div(self, _sint(b, "//"))
  def __rfloordiv__(self, b: int) -> Node: return _div(NumNode(_sint(b, "//")), self)  # type: ignore
  def __mod__(self, b: sint) -> Node: return _mod(self, _sint(b, "%"))
  def __rmod__(self, b: int) -> Node: return _mod(NumNode(_sint(b, "%")), self)  # type: ignore
  def lt(self, b: sint) -> Node: return _lt(self, _sint(b, "lt"))
  def ge(self, b: sint) -> Node: return create_ge_node(self, b)
  def eq(self, b: sint) -> Node: return Node.ands([self.ge(b), self.lt(b + 1)])

  @staticmethod
  def sum(nodes: Iterable[sint]) -> Node:
    """Flattens nested sums, merges like terms (x*2 + x*3 -> x*5) and constants; terms in canonical order (by base,
    then coefficient), the constant last."""
    const, terms = 0, []
    for n in nodes:
      tn = type(n)
      if tn is int: const += n  # type: ignore
      elif tn is NumNode: const += n.b  # type: ignore
      elif tn is SumNode:
        ts = n.nodes  # type: ignore
        if type(ts[-1]) is NumNode: const, ts = const + ts[-1].b, ts[:-1]
        terms.extend(ts)
      elif not isinstance(n, Node): const += _sint(n, "sum")  # type: ignore
      elif n.min == n.max: const += n.min
      else: terms.append(n)
    if len(terms) > 1:
      bases = [t.a if type(t) is MulNode and type(t.b) is int else t for t in terms]
      # equal bases have equal hashes, so distinct hashes mean nothing to merge
      if len({b._hash for b in bases}) < len(bases): terms = _merge_terms(terms, bases)
      terms.sort(key=_term_order)
    if not terms: return NumNode(const)
    if const: terms.append(NumNode(const))
    elif len(terms) == 1: return terms[0]
    return SumNode(terms)

  @staticmethod
  def ands(nodes: Iterable[sint]) -> Node:
    """1 if every node is nonzero else 0; drops always-true nodes, folds to 0 on an always-false one."""
    out: list[Node] = []
    for n in nodes:
      if not isinstance(n, Node): n = NumNode(_sint(n, "ands"))  # type: ignore
      for m in (n.nodes if type(n) is AndNode else (n,)):
        if m.min > 0 or m.max < 0: continue
        if m.min == m.max: return NumNode(0)
        if m not in out: out.append(m)
    if not out: return NumNode(1)
    if len(out) == 1 and out[0].min >= 0 and out[0].max <= 1: return out[0]
    return AndNode(out)

sint = Union[int, Node]

class NumNode(Node):
  __slots__ = ("b",)
  def __init__(self, b: int):
    if not isinstance(b, int): raise ShapeError(f"NumNode needs an int, got {type(b).__name__} {b!r}")
    self.b = self.min = self.max = int(b)
    self._hash, self._key = hash(self.b), None
  def _fields(self) -> tuple: return (self.b,)
  def __eq__(self, other: object) -> bool:
    if type(other) is NumNode: return self.b == other.b
    return isinstance(other, int) and self.b == other
  __hash__ = Node.__hash__
  def __int__(self) -> int: return self.b
  def substitute(self, var_vals: dict[Variable, Union[Node, int]]) -> Node: return self
  def _eval(self, env: dict[Variable, int]) -> int: return self.b

_I64 = 1 << 63

def _var_bound(x: Any, name: Any) -> int:
  """x as an int bound of Variable name: numpy integers are ints, bools and everything else are refused."""
  if isinstance(x, bool) or not hasattr(type(x), "__index__"):
    raise ShapeError(f"Variable {name!r}: bound {x!r} must be an int, not {type(x).__name__}")
  return operator.index(x)

class Variable(Node):
  """A named integer in [nmin, nmax]. Binding a value keeps its identity: a bound Variable == its unbound one.
  The name is an ASCII identifier; renderers spell it under their user prefix (`v_`), never as it is."""
  __slots__ = ("expr", "_val")
  _val: Optional[int]
  def __init__(self, expr: str, nmin: int, nmax: int):
    if type(nmin) is not int or type(nmax) is not int: nmin, nmax = _var_bound(nmin, expr), _var_bound(nmax, expr)
    if not (isinstance(expr, str) and nmin <= nmax and -_I64 <= nmin and nmax < _I64):
      raise ShapeError(f"Variable({expr!r}, {nmin!r}, {nmax!r}) needs a str name and int64 bounds with min <= max")
    if not (expr.isascii() and expr.isidentifier()):
      raise ShapeError(f"Variable name {expr!r} is not an identifier (ASCII letters, digits and _, not a digit first)")
    self.expr, self.min, self.max, self._val = expr, int(nmin), int(nmax), None
    self._hash, self._key = hash((expr, self.min, self.max)), None
  def _fields(self) -> tuple: return (self.expr, self.min, self.max)
  __hash__ = Node.__hash__
  @property
  def val(self) -> Optional[int]: return self._val
  def bind(self, val: int) -> Variable:
    if type(val) is not int and not isinstance(val, bool) and hasattr(type(val), "__index__"): val = operator.index(val)
    if type(val) is not int or not self.min <= val <= self.max:
      raise ShapeError(f"cannot bind {self.expr} to {val!r}: outside [{self.min}, {self.max}]")
    v = Variable(self.expr, self.min, self.max)
    v._val = int(val)
    return v
  def unbind(self) -> tuple[Variable, int]:
    if self._val is None: raise ShapeError(f"cannot unbind {self.expr}: it is not bound")
    return Variable(self.expr, self.min, self.max), self._val
  def substitute(self, var_vals: dict[Variable, Union[Node, int]]) -> Node:
    v = var_vals.get(self, self)
    return v if isinstance(v, Node) else NumNode(v)
  def _eval(self, env: dict[Variable, int]) -> int:
    v = env.get(self, self._val)
    if v is None: raise ShapeError(f"no value for variable {self.expr} (not in var_vals and not bound)")
    return v

class _BinNode(Node):
  __slots__ = ("a", "b")
  a: Node
  b: sint
  def _fields(self) -> tuple: return (self.a, self.b)
  __hash__ = Node.__hash__
  def _set(self, a: Node, b: sint, lo: int, hi: int) -> None:
    self.a, self.b, self.min, self.max, self._key = a, b, lo, hi, None
    self._hash = hash((type(self).__name__, a._hash, hash(b)))
  def _sub(self, var_vals: dict[Variable, Union[Node, int]]) -> tuple[Node, sint]:
    b = self.b.substitute(var_vals) if isinstance(self.b, Node) else self.b
    return self.a.substitute(var_vals), b
  def _evb(self, env: dict[Variable, int]) -> int: return self.b._eval(env) if isinstance(self.b, Node) else self.b

def _check_divisor(a: Node, b: Any, op: str) -> None:
  if isinstance(b, Node) and b.min <= 0:
    raise ShapeError(f"cannot compute {a.key} {op} {b.key}: the divisor can be {b.min}; it must be positive")
  if isinstance(b, int) and b <= 0: raise ShapeError(f"cannot compute {a.key} {op} {b}: the divisor must be positive")

class MulNode(_BinNode):
  __slots__ = ()
  def __init__(self, a: Node, b: sint):
    if isinstance(b, Node):
      c = (a.min * b.min, a.min * b.max, a.max * b.min, a.max * b.max)
      lo, hi = min(c), max(c)
    else: lo, hi = (a.min * b, a.max * b) if b >= 0 else (a.max * b, a.min * b)
    self._set(a, b, lo, hi)
  def substitute(self, var_vals: dict[Variable, Union[Node, int]]) -> Node:
    a, b = self._sub(var_vals)
    return a * b
  def _eval(self, env: dict[Variable, int]) -> int: return self.a._eval(env) * self._evb(env)

class DivNode(_BinNode):
  """floor(a / b) with a >= 0 and b > 0."""
  __slots__ = ()
  def __init__(self, a: Node, b: sint):
    _check_divisor(a, b, "//")
    if a.min < 0: raise ShapeError(f"DivNode({a.key}, {b}) needs a non-negative numerator; build it with //")
    lo, hi = (a.min // b.max, a.max // b.min) if isinstance(b, Node) else (a.min // b, a.max // b)
    self._set(a, b, lo, hi)
  def substitute(self, var_vals: dict[Variable, Union[Node, int]]) -> Node:
    a, b = self._sub(var_vals)
    return a // b
  def _eval(self, env: dict[Variable, int]) -> int: return self.a._eval(env) // self._evb(env)

class ModNode(_BinNode):
  """a - b*floor(a / b) with a >= 0 and b > 0."""
  __slots__ = ()
  def __init__(self, a: Node, b: sint):
    _check_divisor(a, b, "%")
    if a.min < 0: raise ShapeError(f"ModNode({a.key}, {b}) needs a non-negative numerator; build it with %")
    if type(b) is int and a.min // b == a.max // b: lo, hi = a.min % b, a.max % b
    else: lo, hi = 0, min(a.max, (b.max if isinstance(b, Node) else b) - 1)
    self._set(a, b, lo, hi)
  def substitute(self, var_vals: dict[Variable, Union[Node, int]]) -> Node:
    a, b = self._sub(var_vals)
    return a % b
  def _eval(self, env: dict[Variable, int]) -> int: return self.a._eval(env) % self._evb(env)

class LtNode(_BinNode):
  """1 if a < b else 0."""
  __slots__ = ()
  def __init__(self, a: Node, b: sint):
    bmin, bmax = (b.min, b.max) if isinstance(b, Node) else (b, b)
    self._set(a, b, int(a.max < bmin), int(a.min < bmax))
  def substitute(self, var_vals: dict[Variable, Union[Node, int]]) -> Node:
    a, b = self._sub(var_vals)
    return a.lt(b)
  def _eval(self, env: dict[Variable, int]) -> int: return int(self.a._eval(env) < self._evb(env))

class _ListNode(Node):
  __slots__ = ("nodes",)
  nodes: tuple[Node, ...]
  def _fields(self) -> tuple: return self.nodes
  __hash__ = Node.__hash__
  def _set(self, nodes: Iterable[Node], lo: int, hi: int) -> None:
    self.nodes, self.min, self.max, self._key = tuple(nodes), lo, hi, None
    self._hash = hash((type(self).__name__,) + tuple(n._hash for n in self.nodes))

class SumNode(_ListNode):
  """Σ nodes; built by Node.sum it has no nested sums, merged like terms and at most one (last) NumNode."""
  __slots__ = ()
  def __init__(self, nodes: Iterable[Node]):
    nodes = tuple(nodes)
    self._set(nodes, sum(n.min for n in nodes), sum(n.max for n in nodes))
  def substitute(self, var_vals: dict[Variable, Union[Node, int]]) -> Node:
    return Node.sum([n.substitute(var_vals) for n in self.nodes])
  def _eval(self, env: dict[Variable, int]) -> int: return sum(n._eval(env) for n in self.nodes)

class AndNode(_ListNode):
  """1 if every node is nonzero else 0."""
  __slots__ = ()
  def __init__(self, nodes: Iterable[Node]):
    nodes = tuple(nodes)
    lo = int(all(n.min > 0 or n.max < 0 for n in nodes))
    hi = int(not any(n.min == n.max == 0 for n in nodes))
    self._set(nodes, lo, hi)
  def substitute(self, var_vals: dict[Variable, Union[Node, int]]) -> Node:
    return Node.ands([n.substitute(var_vals) for n in self.nodes])
  def _eval(self, env: dict[Variable, int]) -> int: return int(all(n._eval(env) for n in self.nodes))

# ***** simplifying builders (a is a Node, b an int or a non-constant Node) *****

def _mul_nodes(a: Node, b: Node) -> Node:
  """a*b of two non-constant Nodes in canonical form: the factors of both in canonical order as a left-deep chain
  ((x*y)*z), their int coefficients multiplied into one outermost coefficient. A sum factor gives up its content
  (the gcd of its coefficients, signed so its first term's is positive): (2x+2y)*z == (x+y)*(z*2)."""
  coef, factors, stack = 1, [], [b, a]
  while stack:
    n = stack.pop()
    if type(n) is SumNode:
      n, g = _primitive(n)
      coef *= g
    if type(n) is not MulNode: factors.append(n)
    elif type(n.b) is int:
      coef *= n.b
      stack.append(n.a)
    elif isinstance(n.b, Node): stack.extend((n.b, n.a))
  factors.sort(key=_order)
  p = factors[0]
  for f in factors[1:]: p = MulNode(p, f)
  return p if coef == 1 else MulNode(p, coef)

def _primitive(s: SumNode) -> tuple[Node, int]:
  """(p, g) with s == p*g, g the gcd of s's coefficients and constant, negative when s's first coefficient is."""
  terms, const = _const_split(s)
  cs = [_split(t)[1] for t in terms]
  g = gcd(const, *cs) * (-1 if cs[0] < 0 else 1)
  if g == 1: return s, 1
  return Node.sum([*(_mul(_split(t)[0], c // g) for t, c in zip(terms, cs)), const // g]), g

def _mul(a: Node, b: sint) -> Node:
  if isinstance(b, Node):
    if a.min != a.max: return _mul_nodes(a, b)
    a, b = b, a.min
  if a.min == a.max: return NumNode(a.min * b)
  if b == 0: return NumNode(0)
  if b == 1: return a
  if type(a) is MulNode and type(a.b) is int: return _mul(a.a, a.b * b)
  if type(a) is SumNode: return Node.sum([_mul(t, b) for t in a.nodes])
  return MulNode(a, b)

def _small_split(terms: list[Node], const: int, b: int) -> Optional[tuple[int, Node, Node]]:
  """Find g > 1 dividing b with Σterms + const == g*big + small and 0 <= small < g; return (g, big, small)."""
  for g in sorted({gcd(_split(t)[1], b) for t in terms} - {1}, reverse=True):
    big, small = [], []
    for t in terms:
      base, c = _split(t)
      if c % g == 0: big.append(_mul(base, c // g))
      else: small.append(t)
    if big and 0 <= sum(t.min for t in small) + const and sum(t.max for t in small) + const < g:
      return g, Node.sum(big), Node.sum([*small, const])
  return None

def _const_split(a: SumNode) -> tuple[list[Node], int]:
  if type(a.nodes[-1]) is NumNode: return list(a.nodes[:-1]), a.nodes[-1].b
  return list(a.nodes), 0

def _exact_quot(a: Node, b: Node) -> Optional[Node]:
  """a / b when b divides a structurally, else None."""
  if a == b: return NumNode(1)
  if type(a) is MulNode:
    if a.a == b: return a.b if isinstance(a.b, Node) else NumNode(a.b)
    if a.b == b: return a.a
    q = _exact_quot(a.a, b)
    return None if q is None else q * a.b
  if type(a) is SumNode:
    qs = [_exact_quot(t, b) for t in a.nodes]
    return None if any(q is None for q in qs) else Node.sum(qs)  # type: ignore
  return None

def _divmod_node(a: Node, b: Node, is_div: bool) -> Node:
  """a // b or a % b for a divisor that is a non-constant Node: shape bookkeeping such as (n*4)//n."""
  _check_divisor(a, b, "//" if is_div else "%")
  if a.min < 0:
    k = _ceildiv(-a.min, b.min)
    return _div(a + b * k, b) - k if is_div else _mod(a + b * k, b)
  if a.max < b.min: return NumNode(0) if is_div else a
  q = _exact_quot(a, b)
  if q is not None: return q if is_div else NumNode(0)
  if is_div and a.min // b.max == a.max // b.min: return NumNode(a.min // b.max)
  return DivNode(a, b) if is_div else ModNode(a, b)

def _div(a: Node, b: sint) -> Node:
  if isinstance(b, Node): return _divmod_node(a, b, True)
  if b <= 0: _check_divisor(a, b, "//")
  if b == 1: return a
  if a.min < 0:
    k = _ceildiv(-a.min, b)
    return _div(a + k * b, b) - k
  if a.min // b == a.max // b: return NumNode(a.min // b)
  if type(a) is MulNode and type(a.b) is int:
    g = gcd(a.b, b)
    if g > 1: return _div(_mul(a.a, a.b // g), b // g)
  elif type(a) is DivNode: return _div(a.a, a.b * b)
  elif type(a) is SumNode:
    r = _div_sum(a, b)
    if r is not None: return r
  return DivNode(a, b)

def _div_sum(a: SumNode, b: int) -> Optional[Node]:
  terms, const = _const_split(a)
  quot, rest = [], []
  for t in terms:
    base, c = _split(t)
    if c % b == 0: quot.append(_mul(base, c // b))
    else: rest.append(t)
  # (b*Q + R + c) // b == Q + q + (R + c - q*b) // b, with q chosen so the new numerator's min is in [0, b)
  q = (sum(t.min for t in rest) + const) // b
  if quot or q: return Node.sum([*quot, q, _div(Node.sum([*rest, const - q * b]), b)])
  g = gcd(b, const, *(_split(t)[1] for t in rest))
  if g > 1: return _div(Node.sum([*(_mul(_split(t)[0], _split(t)[1] // g) for t in rest), const // g]), b // g)
  sm = _small_split(rest, const, b)
  # (g*B + s) // b == B // (b/g) when g | b and 0 <= s < g
  return None if sm is None else _div(sm[1], b // sm[0])

def _mod(a: Node, b: sint) -> Node:
  if isinstance(b, Node): return _divmod_node(a, b, False)
  if b <= 0: _check_divisor(a, b, "%")
  if b == 1: return NumNode(0)
  if a.min < 0: return _mod(a + _ceildiv(-a.min, b) * b, b)
  q = a.min // b
  if q == a.max // b: return a - q * b
  if type(a) is MulNode and type(a.b) is int:
    c = a.b % b
    if c == 0: return NumNode(0)
    g = gcd(c, b)
    if g > 1: return _mul(_mod(_mul(a.a, c // g), b // g), g)
    if c != a.b: return _mod(_mul(a.a, c), b)
  elif type(a) is ModNode and type(a.b) is int and a.b % b == 0: return _mod(a.a, b)
  elif type(a) is SumNode:
    r = _mod_sum(a, b)
    if r is not None: return r
  return ModNode(a, b)

def _mod_sum(a: SumNode, b: int) -> Optional[Node]:
  terms, const = _const_split(a)
  changed, kept = False, []
  for t in terms:
    base, c = _split(t)
    if -b < c < b: kept.append(t); continue
    changed, c = True, (c % b if c > 0 else -(-c % b))
    if c: kept.append(_mul(base, c))
  q = (sum(t.min for t in kept) + const) // b
  if changed or q: return _mod(Node.sum([*kept, const - q * b]), b)
  g = gcd(b, const, *(_split(t)[1] for t in kept))
  if g > 1: return _mul(_mod(Node.sum([*(_mul(_split(t)[0], _split(t)[1] // g) for t in kept), const // g]), b // g), g)
  sm = _small_split(kept, const, b)
  # (g*B + s) % b == g*(B % (b/g)) + s when g | b and 0 <= s < g
  return None if sm is None else Node.sum([_mul(_mod(sm[1], b // sm[0]), sm[0]), sm[2]])

def _lt(a: Node, b: sint) -> Node:
  if isinstance(b, Node):
    if a.max < b.min: return NumNode(1)
    if a.min >= b.max: return NumNode(0)
    d = a - b
    if d.max < 0 or d.min >= 0: return NumNode(int(d.max < 0))
    return LtNode(a, b)
  if a.max < b: return NumNode(1)
  if a.min >= b: return NumNode(0)
  if type(a) is MulNode and type(a.b) is int and a.b > 0: return _lt(a.a, _ceildiv(b, a.b))
  if type(a) is DivNode and type(a.b) is int: return _lt(a.a, b * a.b)
  if type(a) is SumNode:
    terms, const = _const_split(a)
    if const: return _lt(Node.sum(terms), b - const)
    g = gcd(*(_split(t)[1] for t in terms))
    if g > 1: return _lt(Node.sum([_mul(_split(t)[0], _split(t)[1] // g) for t in terms]), _ceildiv(b, g))
    # g*B + s < b  <=>  B < b/g  when g | b and 0 <= s < g
    sm = _small_split(terms, 0, b)
    if sm is not None: return _lt(sm[1], b // sm[0])
  return LtNode(a, b)

def create_lt_node(lhs: Node, b: sint) -> Node:
  """lhs < b, simplified."""
  return _lt(lhs, _sint(b, "lt"))

def create_ge_node(lhs: Node, b: sint) -> Node:
  """lhs >= b, built as -lhs < 1 - b."""
  return _lt(-lhs, _sint(1 - b, "ge"))

def sym_infer(x: sint, var_vals: dict[Variable, int]) -> int:
  """The value of x; variables missing from var_vals use their bound value."""
  return x if isinstance(x, int) else x._eval(var_vals)

def _r(x: sint, ops: RenderOps, ctx: Any) -> Any: return x.render(ops, ctx) if isinstance(x, Node) else str(x)

def _render_var(n: Variable, ops: RenderOps, ctx: Any) -> str:
  if ctx != "DEBUG": return n.expr
  return f"{n.expr}[{n.min}..{n.max}{'' if n.val is None else f'={n.val}'}]"

STR_OPS: RenderOps = {
  Variable: _render_var,
  NumNode: lambda n, ops, ctx: str(n.b),
  MulNode: lambda n, ops, ctx: f"({n.a.render(ops, ctx)}*{_r(n.b, ops, ctx)})",
  DivNode: lambda n, ops, ctx: f"({n.a.render(ops, ctx)}/{_r(n.b, ops, ctx)})",
  ModNode: lambda n, ops, ctx: f"({n.a.render(ops, ctx)}%{_r(n.b, ops, ctx)})",
  LtNode: lambda n, ops, ctx: f"({n.a.render(ops, ctx)}<{_r(n.b, ops, ctx)})",
  SumNode: lambda n, ops, ctx: f"({'+'.join(x.render(ops, ctx) for x in n.nodes)})",
  AndNode: lambda n, ops, ctx: f"({'&&'.join(x.render(ops, ctx) for x in n.nodes)})",
}

_RANK.update({NumNode: 0, Variable: 1, MulNode: 2, DivNode: 3, ModNode: 4, LtNode: 5, SumNode: 6, AndNode: 7})
