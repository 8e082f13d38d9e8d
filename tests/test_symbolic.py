import itertools
import math
import pickle
import pytest
from hypothesis import given, settings, strategies as st
from kernopt.errors import ShapeError
from kernopt.shape.symbolic import (Variable, NumNode, MulNode, DivNode, ModNode, LtNode, SumNode, AndNode, Node,
                                    sym_infer, create_lt_node, create_ge_node)

x, y, z = Variable("x", 0, 7), Variable("y", 0, 7), Variable("z", -4, 5)

def check(node, rendered, lo=None, hi=None):
  assert node.render() == rendered
  if lo is not None: assert (node.min, node.max) == (lo, hi)

# ***** one test per rewrite *****

def test_constant_folding():
  assert (NumNode(3) + 4) == 7 and isinstance(NumNode(3) * 4, NumNode)
  assert x * 0 == 0 and x - x == 0 and (x + 3) - 3 == x
  assert isinstance((x + 1) * 2 - x * 2, NumNode) and (x + 1) * 2 - x * 2 == 2
  check(x * 1, "x", 0, 7)

def test_constant_variable_folds():
  one = Variable("one", 0, 0)
  assert one * 4 == 0 and isinstance(x + one, Variable)

def test_like_terms():
  check(x * 2 + x * 3, "(x*5)", 0, 35)
  check(x + 2 + y + 3 + x, "((x*2)+y+5)", 5, 26)
  check((x * 2 + y) - (y + x), "x", 0, 7)

def test_products_of_constants():
  check((x * 2) * 3, "(x*6)", 0, 42)
  check((x + 1) * 3, "((x*3)+3)", 3, 24)
  check(-x, "(x*-1)", -7, 0)
  check(3 - x, "((x*-1)+3)", -4, 3)

def test_div_factors_common_gcd():
  check((x * 4 + y * 8 + 4) // 4, "(x+(y*2)+1)", 1, 22)
  check((x * 6 + y * 4) // 4, "(y+((x*3)/2))", 0, 17)

def test_div_by_one_and_trivial_bounds():
  assert x // 1 is x
  check(x // 8, "0", 0, 0)
  check((x + 8) // 8, "1", 1, 1)

def test_div_extracts_multiples():
  check((x * 8 + y) // 8, "x", 0, 7)
  check((x * 8 + Variable("w", 0, 15)) // 8, "(x+(w/8))", 0, 8)
  check((Variable("w", 0, 15) + 13) // 4, "(((w+1)/4)+3)", 3, 7)

def test_div_small_terms_dropped():
  w = Variable("w", 0, 3)
  check((x * 4 + w) // 8, "(x/2)", 0, 3)
  check((x * 4 + Variable("w", 0, 4)) // 8, "((w+(x*4))/8)", 0, 4)  # w may reach 4: not droppable

def test_div_of_div_and_of_mul():
  check((x // 2) // 3, "(x/6)", 0, 1)
  check((x * 6) // 4, "((x*3)/2)", 0, 10)
  check((x * 2) // 4, "(x/2)", 0, 3)

def test_div_negative_numerator_is_shifted():
  n = z // 4
  check(n, "(((z+4)/4)+-1)", -1, 1)
  assert all(sym_infer(n, {z: v}) == v // 4 for v in range(-4, 6))

def test_mod_trivial_and_shifted():
  check(x % 8, "x", 0, 7)
  check((x + 8) % 8, "x", 0, 7)
  check(z % 4, "((z+4)%4)", 0, 3)
  assert x % 1 == 0

def test_mod_drops_multiples():
  check((x * 8 + y) % 8, "y", 0, 7)
  check((x * 9 + y) % 8, "((x+y)%8)", 0, 7)
  check((x * 8) % 4, "0", 0, 0)

def test_mod_of_mod():
  w = Variable("w", 0, 100)
  check((w % 16) % 8, "(w%8)", 0, 7)
  check((w % 4) % 8, "(w%4)", 0, 3)

def test_mod_gcd_and_small_terms():
  w, v = Variable("w", 0, 100), Variable("v", 0, 3)
  check((w * 6) % 4, "((w%2)*2)", 0, 2)
  check((w * 4 + v) % 8, "(v+((w%2)*4))", 0, 7)

def test_lt_folding_on_bounds():
  assert (x + y).lt(15) == 1 and (x + y).lt(0) == 0 and isinstance(x.lt(8), NumNode)
  check((x + 3).lt(5), "(x<2)", 0, 1)
  check((x * 4).lt(9), "(x<3)")
  check((x * 2 + y * 4).lt(7), "((x+(y*2))<4)")
  check((x * 4 + Variable("w", 0, 3)).lt(8), "(x<2)")
  check((Variable("w", 0, 100) // 4).lt(3), "(w<12)")
  assert isinstance(create_lt_node(x, 3), LtNode) and create_ge_node(x, 0) == 1

def test_ge_eq_and_ands():
  assert x.ge(0) == 1 and x.ge(8) == 0
  e = x.eq(3)
  assert [sym_infer(e, {x: v}) for v in range(8)] == [int(v == 3) for v in range(8)]
  assert Node.ands([x.lt(3), 1, NumNode(1)]) == x.lt(3)
  assert Node.ands([x.lt(3), y.lt(9)]) == x.lt(3)
  assert Node.ands([x.lt(3), x.lt(-1)]) == 0 and Node.ands([]) == 1
  a = Node.ands([x.lt(3), y.lt(4), Node.ands([x.lt(3), z.lt(2)])])
  assert isinstance(a, AndNode) and len(a.nodes) == 3 and (a.min, a.max) == (0, 1)

def test_symbolic_divisor():
  n = Variable("n", 1, 64)
  assert (n * 4) // n == 4 and n // n == 1 and (n * 4) % n == 0 and (n * x + n) // n == x + 1
  check(x // n, "(x/n)", 0, 7)
  assert [sym_infer(z // n, {z: a, n: b}) for a in range(-4, 6) for b in (1, 2, 3)] == \
         [a // b for a in range(-4, 6) for b in (1, 2, 3)]

# ***** Node basics *****

def test_equality_and_hash():
  assert x * 2 + 1 == 1 + 2 * x and hash(x * 2 + 1) == hash(1 + 2 * x)
  assert NumNode(3) == 3 and 3 == NumNode(3) and hash(NumNode(3)) == hash(3)
  assert x != 3 and (x + 1) != 1 and x != Variable("x", 0, 8) and x == Variable("x", 0, 7)
  assert len({x + y, y + x * 1, x + y}) == 1   # canonical order

def test_variable_bind_unbind_vars_substitute():
  n = Variable("n", 1, 64)
  b = n.bind(5)
  assert b.val == 5 and n.val is None and b == n and b.unbind() == (n, 5)
  assert sym_infer(b * 2, {}) == 10 and sym_infer(b * 2, {n: 7}) == 14 and sym_infer(6, {}) == 6
  with pytest.raises(ShapeError, match="outside"): n.bind(65)
  with pytest.raises(ShapeError, match="not bound"): n.unbind()
  with pytest.raises(ShapeError, match="no value for variable n"): sym_infer(n + 1, {})
  with pytest.raises(ShapeError): Variable("bad", 3, 2)
  e = (x * 4 + y) // 4 + n
  assert e.vars() == {x, y, n}
  assert e.substitute({x: 2, y: NumNode(3), n: 10}) == 12 and e.substitute({n: x}) == x * 2 + y // 4
  assert pickle.loads(pickle.dumps(e)) == e

def test_key_cached_and_debug_render():
  e = (x * 4 + z) % 3
  assert e.key is e.key and e.key == e.render() == "((x+z+6)%3)"
  assert e.render(ctx="DEBUG") == "((x[0..7]+z[-4..5]+6)%3)" and repr(x.bind(2)) == "<x[0..7=2]>"

def test_divide_by_zero_or_negative_raises():
  for d in (0, -3):
    with pytest.raises(ShapeError, match=rf"cannot compute \(x\+y\) // {d}: the divisor must be positive"): (x + y) // d
    with pytest.raises(ShapeError, match=rf"\(x\+y\) % {d}"): (x + y) % d
  with pytest.raises(ShapeError, match=r"x // z: the divisor can be -4"): x // z
  with pytest.raises(ShapeError, match=r"divisor can be 0"): x % Variable("k", 0, 3)
  with pytest.raises(ShapeError): DivNode(z, 3)
  with pytest.raises(ShapeError): x * 1.5

# ***** render(ops): translate to a tuple tree, then evaluate it *****

TUPLE_OPS = {
  NumNode: lambda n, ops, ctx: ("const", n.b),
  Variable: lambda n, ops, ctx: ("var", n.expr),
  **{cls: (lambda name: lambda n, ops, ctx: (name, n.a.render(ops, ctx), n.b if isinstance(n.b, int) else
                                             n.b.render(ops, ctx)))(name)
     for cls, name in ((MulNode, "mul"), (DivNode, "div"), (ModNode, "mod"), (LtNode, "lt"))},
  SumNode: lambda n, ops, ctx: ("sum",) + tuple(c.render(ops, ctx) for c in n.nodes),
  AndNode: lambda n, ops, ctx: ("and",) + tuple(c.render(ops, ctx) for c in n.nodes),
}

def eval_tree(t, env):
  """Evaluate a tuple tree with C semantics (truncating / and %), checking numerators are never negative."""
  if isinstance(t, int): return t
  op, *args = t
  if op == "const": return args[0]
  if op == "var": return env[args[0]]
  vals = [eval_tree(a, env) for a in args]
  if op in ("div", "mod"):
    assert vals[0] >= 0 and vals[1] > 0, f"{t} divides {vals[0]} by {vals[1]}"
    q = math.trunc(vals[0] / vals[1])
    return q if op == "div" else vals[0] - q * vals[1]
  return {"mul": lambda: vals[0] * vals[1], "lt": lambda: int(vals[0] < vals[1]), "sum": lambda: sum(vals),
          "and": lambda: int(all(vals))}[op]()

def test_render_ops_tuple_tree():
  e = Node.ands([((x * 4 + z) // 3 % 5).lt(3), (x + y).ge(2)])
  tree = e.render(TUPLE_OPS)
  assert tree[0] == "and"
  for vx, vy, vz in itertools.product(range(8), range(8), range(-4, 6)):
    ref = int(((vx * 4 + vz) // 3 % 5) < 3 and vx + vy >= 2)
    assert eval_tree(tree, {"x": vx, "y": vy, "z": vz}) == ref == sym_infer(e, {x: vx, y: vy, z: vz})

# ***** property test: random expressions against brute force *****

RANGES = [(0, 7), (-4, 5), (1, 4), (0, 3), (-2, 2), (2, 9), (0, 1), (0, 2), (0, 4)]

def leaf(nvars):
  lin = st.tuples(st.just("lin"), st.lists(st.integers(-4, 6), min_size=nvars, max_size=nvars), st.integers(-5, 9))
  var = st.tuples(st.just("var"), st.integers(0, nvars - 1))
  return st.one_of(var, st.tuples(st.just("const"), st.integers(-3, 9)), lin)

def exprs(nvars):
  def extend(sub):
    return st.one_of(
      st.tuples(st.sampled_from(["add", "sub", "mul", "and", "ltn"]), sub, sub),
      st.tuples(st.sampled_from(["mulc", "divc", "modc", "lt"]), sub, st.integers(-3, 9)),
      st.tuples(st.sampled_from(["divc", "modc"]), sub, st.integers(1, 12)),
      st.tuples(st.sampled_from(["divv", "modv"]), sub, st.integers(0, nvars - 1)),
      st.tuples(st.just("neg"), sub))
  return st.recursive(leaf(nvars), extend, max_leaves=8)

def build(e, vs):
  """(node or None when the expression divides by a non-positive value, reference function of the values)."""
  op = e[0]
  if op == "var": return vs[e[1]], lambda env, i=e[1]: env[i]
  if op == "const": return NumNode(e[1]), lambda env: e[1]
  if op == "lin": return (Node.sum([v * c for v, c in zip(vs, e[1])] + [e[2]]),
                          lambda env: sum(a * c for a, c in zip(env, e[1])) + e[2])
  if op == "neg":
    a, fa = build(e[1], vs)
    return -a, lambda env: -fa(env)
  a, fa = build(e[1], vs)
  if op in ("mulc", "divc", "modc", "lt"):
    c = e[2]
    if op in ("divc", "modc") and c <= 0:
      with pytest.raises(ShapeError, match="divisor must be positive"): a // c if op == "divc" else a % c
      c = 3
    node = {"mulc": lambda: a * c, "divc": lambda: a // c, "modc": lambda: a % c, "lt": lambda: a.lt(c)}[op]()
    ref = {"mulc": lambda env: fa(env) * c, "divc": lambda env: fa(env) // c, "modc": lambda env: fa(env) % c,
           "lt": lambda env: int(fa(env) < c)}[op]
    return node, ref
  if op in ("divv", "modv"):
    v, i = vs[e[2]], e[2]
    if v.min <= 0:
      with pytest.raises(ShapeError, match="divisor can be"): a // v if op == "divv" else a % v
      return a, fa
    return (a // v, lambda env: fa(env) // env[i]) if op == "divv" else (a % v, lambda env: fa(env) % env[i])
  b, fb = build(e[2], vs)
  node = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b, "ltn": lambda: a.lt(b),
          "and": lambda: Node.ands([a, b])}[op]()
  ref = {"add": lambda env: fa(env) + fb(env), "sub": lambda env: fa(env) - fb(env),
         "mul": lambda env: fa(env) * fb(env),
         "ltn": lambda env: int(fa(env) < fb(env)), "and": lambda env: int(bool(fa(env)) and bool(fb(env)))}[op]
  return node, ref

def py_source(node):
  """The rendered C-like string as Python: safe because every numerator is non-negative (checked by eval_tree)."""
  return node.render().replace("/", "//").replace("&&", " and ")

def and_nodes(node):
  if isinstance(node, AndNode): yield node
  for c in (node.nodes if isinstance(node, (SumNode, AndNode)) else (node.a, node.b) if hasattr(node, "a") else ()):
    if isinstance(c, Node): yield from and_nodes(c)

@st.composite
def cases(draw):
  nvars = draw(st.integers(1, 3))
  ranges = [draw(st.sampled_from(RANGES)) for _ in range(nvars)]
  return ranges, draw(exprs(nvars))

@settings(max_examples=500, derandomize=True, deadline=None)
@given(cases())
def test_random_expressions_match_brute_force(case):
  ranges, e = case
  vs = [Variable(f"v{i}", lo, hi) for i, (lo, hi) in enumerate(ranges)]
  node, ref = build(e, vs)
  if isinstance(node, int): node = NumNode(node)
  tree, code = node.render(TUPLE_OPS), compile(py_source(node), "<sym>", "eval")
  assert node.vars() <= set(vs)
  py_ok = all(c.min >= 0 and c.max <= 1 for a in and_nodes(node) for c in a.nodes)  # Python's `and` returns an operand
  for n, vals in enumerate(itertools.product(*(range(lo, hi + 1) for lo, hi in ranges))):
    want, env = ref(vals), dict(zip(vs, vals))
    names = {v.expr: val for v, val in env.items()}
    assert sym_infer(node, env) == want, (node, vals)
    assert node.min <= want <= node.max, (node, vals, node.min, node.max)
    assert eval_tree(tree, names) == want, (node, vals)
    if py_ok: assert eval(code, {}, names) == want, (node, vals)
    if n % 11 == 0:
      sub = node.substitute(env)
      assert isinstance(sub, NumNode) and sub.b == want, (node, vals, sub)
