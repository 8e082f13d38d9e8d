"""Canonical form of symbolic sums and products (issue 14, item 5): an expression built with its sums' and products'
operands in any order and association compares, hashes and renders equal, and evaluates as the expression it
describes at every point of its variables' (small) ranges, inside its bounds. Seeded random expressions."""
import itertools
import random
from typing import Any
import pytest
from kernopt.shape.symbolic import MulNode, Node, NumNode, SumNode, Variable

VARS = [Variable("x", 0, 3), Variable("y", 1, 4), Variable("z", -2, 2), Variable("w", 0, 5)]

def gen(r: random.Random, depth: int) -> Any:
  """A random expression description: a Variable, an int, or (op, ...) with n-ary "add" and "mul"."""
  if depth == 0 or r.random() < 0.25: return r.choice(VARS) if r.random() < 0.7 else r.randint(-3, 5)
  kind = r.choice(["add", "add", "mul", "mul", "div", "mod", "neg", "lt"])
  if kind == "add": return ("add", [gen(r, depth - 1) for _ in range(r.randint(2, 4))])
  if kind == "mul": return ("mul", [gen(r, depth - 1) for _ in range(r.randint(2, 3))])
  if kind in ("div", "mod"): return (kind, gen(r, depth - 1), r.randint(1, 5))
  if kind == "lt": return ("lt", gen(r, depth - 1), r.randint(-2, 6))
  return ("neg", gen(r, depth - 1))

def value(d: Any, env: dict) -> int:
  """The description's value: Python's floor division and modulo, as the symbolic nodes define them."""
  if isinstance(d, Variable): return env[d]
  if isinstance(d, int): return d
  k = d[0]
  if k == "add": return sum(value(c, env) for c in d[1])
  if k == "mul":
    out = 1
    for c in d[1]: out *= value(c, env)
    return out
  if k == "div": return value(d[1], env) // d[2]
  if k == "mod": return value(d[1], env) % d[2]
  if k == "lt": return int(value(d[1], env) < d[2])
  return -value(d[1], env)

def build(d: Any, r: random.Random) -> Any:
  """The Node (or int) of a description, each sum and product folded in a random order and association."""
  if not isinstance(d, tuple): return d
  k = d[0]
  if k in ("add", "mul"):
    parts = [build(c, r) for c in d[1]]
    r.shuffle(parts)
    return fold(parts, k, r)
  a = build(d[1], r)
  if k == "div": return a // d[2]
  if k == "mod": return a % d[2]
  if k == "lt": return a.lt(d[2]) if isinstance(a, Node) else int(a < d[2])
  return -a

def fold(parts: list, kind: str, r: random.Random) -> Any:
  if len(parts) == 1: return parts[0]
  cut = r.randint(1, len(parts) - 1)
  a, b = fold(parts[:cut], kind, r), fold(parts[cut:], kind, r)
  if r.random() < 0.5: a, b = b, a
  return a + b if kind == "add" else a * b

def as_node(x: Any) -> Node: return x if isinstance(x, Node) else NumNode(x)

def used(d: Any) -> set:
  if isinstance(d, Variable): return {d}
  if not isinstance(d, tuple): return set()
  return set().union(*(used(c) for c in (d[1] if d[0] in ("add", "mul") else [d[1]])))

@pytest.mark.parametrize("seed", range(8))
def test_permuted_constructions_are_equal_and_evaluate_right(seed):
  r = random.Random(seed)
  for _ in range(60):
    d = gen(r, 4)
    n1, n2 = as_node(build(d, random.Random(r.random()))), as_node(build(d, random.Random(r.random())))
    assert n1 == n2 and hash(n1) == hash(n2) and n1.render() == n2.render(), (d, n1, n2)
    vs = sorted(used(d), key=lambda v: v.expr)
    for vals in itertools.product(*(range(v.min, v.max + 1) for v in vs)):
      env = dict(zip(vs, vals))
      want = value(d, env)
      assert n1._eval(env) == want and n1.min <= want <= n1.max, (d, n1, env)

def test_sums_and_products_in_any_order():
  x, y, z, w = VARS
  assert x + y == y + x and hash(x + y) == hash(y + x)
  assert x * y == y * x and hash(x * y) == hash(y * x)
  assert (x + y) + z == x + (z + y) == z + y + x
  assert (x * y) * z == x * (z * y) == z * (y * x) and hash((x * y) * z) == hash(z * (y * x))
  assert (x * 3) * y == x * (y * 3) == (y * x) * 3 == 3 * (x * y)
  assert (x + y) * z == z * (y + x) and (x + y) * (z + w) == (w + z) * (y + x)
  assert x * y * 2 + z == z + 2 * (y * x) and x * y + y * x == (x * y) * 2
  # a sum factor's content and sign go to the coefficient
  assert (x * 2 + y * 2) * z == (x + y) * (z * 2) and (-(x + y)) * z == (x + y) * -z
  assert len({x + y, y + x, x + y + 0, (y * 1) + x}) == 1

def test_canonical_order_does_not_depend_on_the_process():
  """str hashes are salted per process: the order (so the rendered source) must come from structure, not hashes."""
  import subprocess
  import sys
  code = ("from kernopt.shape.symbolic import Variable as V\n"
          "a, b, c = V('gidx0', 0, 9), V('lidx1', 0, 3), V('ridx2', 0, 7)\n"
          "print((c * 4 + a * b + b + a * 16 + (c + b) * a).render())")
  outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": str(s), "PATH": ""}).stdout for s in (1, 2, 3)}
  assert len(outs) == 1, outs

def test_canonical_node_shapes():
  x, y, z, _ = VARS
  s = z * x * 3 * y
  assert type(s) is MulNode and s.b == 3 and s.a == x * y * z and s.render() == "(((x*y)*z)*3)"
  t = y * 2 + x + 5
  assert type(t) is SumNode and t.render() == "(x+(y*2)+5)"
