"""Small pure helpers, the one config object for every knob, and the on-disk cache.
Imports only the standard library."""
from __future__ import annotations
import contextlib, contextvars, functools, hashlib, os, pickle, re, sqlite3, sys, tempfile, threading
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, TypeGuard, TypeVar, overload

T = TypeVar("T")

def prod(xs: Iterable[Any]) -> Any:
  """The product of xs (1 for none); works on ints and symbolic nodes."""
  ret: Any = 1
  for x in xs: ret = ret * x
  return ret

def dedup(xs: Iterable[T]) -> list[T]:
  """xs without repeats, in first-seen order."""
  return list(dict.fromkeys(xs))

def all_same(xs: Sequence[Any]) -> bool: return all(x == xs[0] for x in xs[1:])
@overload
def all_int(xs: tuple[Any, ...]) -> TypeGuard[tuple[int, ...]]: ...
@overload
def all_int(xs: Iterable[Any]) -> bool: ...
def all_int(xs: Iterable[Any]) -> bool: return all(isinstance(x, int) for x in xs)
def round_up(n: int, multiple: int) -> int: return (n + multiple - 1) // multiple * multiple
def flatten(xss: Iterable[Iterable[T]]) -> list[T]: return [x for xs in xss for x in xs]

_ANSI = re.compile(r"\x1b\[\d+m")
_COLORS = ["black", "red", "green", "yellow", "blue", "magenta", "cyan", "white"]

def colored(text: Any, color: Optional[str], background: bool = False) -> str:
  """text wrapped in an ANSI colour; an upper-case colour name selects the bright variant."""
  if color is None: return str(text)
  code = 10 * background + 60 * color.isupper() + 30 + _COLORS.index(color.lower())
  return f"\x1b[{code}m{text}\x1b[0m"

def ansistrip(s: str) -> str: return _ANSI.sub("", s)
def ansilen(s: str) -> int:
  """The printed width of s, ignoring ANSI escapes."""
  return len(ansistrip(s))

def to_function_name(s: str) -> str:
  """s made into a C identifier: escapes dropped, other non-identifier characters hex-encoded."""
  return "".join(c if c.isalnum() or c == "_" else f"{ord(c):02X}" for c in ansistrip(s))

def get_contraction(old_shape: tuple[Any, ...], new_shape: tuple[Any, ...]) -> Optional[list[list[int]]]:
  """For each axis of new_shape, the axes of old_shape that multiply into it; None if new_shape is not a
  grouping of consecutive old axes."""
  acc_old = list(_cumprod(old_shape))
  acc_new = list(_cumprod(new_shape))
  try: split = [acc_old.index(x) + 1 if x != 1 else 0 for x in acc_new]
  except ValueError: return None
  return [list(range(st, ed)) for st, ed in zip([0] + split[:-1], split[:-1] + [len(old_shape)])]

def _cumprod(xs: Iterable[Any]) -> Iterator[Any]:
  acc: Any = 1
  for x in xs:
    acc = acc * x
    yield acc

# ***** the config object *****

def _default_cache_dir() -> str:
  if os.environ.get("XDG_CACHE_HOME"): base = os.environ["XDG_CACHE_HOME"]
  elif sys.platform == "darwin": base = os.path.join(os.path.expanduser("~"), "Library", "Caches")
  else: base = os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "kernopt")

@dataclass(frozen=True)
class Config:
  """Every knob kernopt reads. Defaults come from the environment once (`Config.from_env`); code overrides
  them for the current thread or context with `with config_override(DEBUG=2): ...`."""
  DEBUG: int = 0
  BEAM: int = 0
  USE_TC: int = 1
  TC_OPT: int = 0
  MV: int = 1
  MV_BLOCKSIZE: int = 4
  MV_THREADS_PER_ROW: int = 8
  MV_ROWS_PER_THREAD: int = 4
  NOLOCALS: int = 0
  DEVICE: str = ""
  CACHE_DIR: str = ""
  DISABLE_CACHE: int = 0
  GRAPHUOPS: int = 0
  RUN_PROCESS_REPLAY: int = 0
  CPU_THREADS: int = 0
  CL_DEVICE: str = ""
  FUZZ_N: int = 0
  COMPILE_TIMEOUT: float = 0.0   # seconds a device compiler may run before its build fails (0: no limit)

  @staticmethod
  def from_env(env: Optional[dict[str, str]] = None) -> Config:
    env = dict(os.environ) if env is None else env
    vals: dict[str, Any] = {}
    for f in fields(Config):
      if f.name not in env: continue
      if f.type in ("int", int, "float", float):
        try: vals[f.name] = (int if f.type in ("int", int) else float)(env[f.name])
        except ValueError: continue
      else: vals[f.name] = env[f.name]
    if "CACHEDIR" in env and "CACHE_DIR" not in vals: vals["CACHE_DIR"] = env["CACHEDIR"]
    return Config(**vals)

  @property
  def cache_dir(self) -> str: return self.CACHE_DIR or _default_cache_dir()

_base_config = Config.from_env()
_config_var: contextvars.ContextVar[Config] = contextvars.ContextVar("kernopt_config", default=_base_config)

def getconfig() -> Config:
  """The config in force in this thread or context."""
  return _config_var.get()

@contextlib.contextmanager
def config_override(**knobs: Any) -> Iterator[Config]:
  """Override knobs for the body of the with-block in the current thread or context only."""
  unknown = set(knobs) - {f.name for f in fields(Config)}
  if unknown: raise ValueError(f"unknown config knobs: {sorted(unknown)}")
  token = _config_var.set(replace(_config_var.get(), **knobs))
  try: yield _config_var.get()
  finally: _config_var.reset(token)

# ***** the on-disk cache *****

_db_lock = threading.Lock()
_db_conns: dict[tuple[str, int], sqlite3.Connection] = {}
CACHE_VERSION = 1

def _cache_db() -> sqlite3.Connection:
  path = os.path.join(getconfig().cache_dir, f"cache_v{CACHE_VERSION}.db")
  key = (path, threading.get_ident())
  if (conn := _db_conns.get(key)) is None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA busy_timeout=60000")
    _db_conns[key] = conn
  return conn

def _table(conn: sqlite3.Connection, table: str) -> str:
  if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", table): raise ValueError(f"bad cache table name {table!r}")
  conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (key TEXT PRIMARY KEY, val BLOB)")
  return table

def diskcache_get(table: str, key: Any) -> Any:
  """The value stored under key in table, or None. Keys are hashed with their repr."""
  if getconfig().DISABLE_CACHE: return None
  with _db_lock:
    conn = _cache_db()
    row = conn.execute(f"SELECT val FROM {_table(conn, table)} WHERE key=?", (_key(key),)).fetchone()
  return pickle.loads(row[0]) if row else None

def diskcache_put(table: str, key: Any, val: Any) -> Any:
  """Store val under key in table (safe with several processes: sqlite WAL + busy timeout); returns val."""
  if getconfig().DISABLE_CACHE: return val
  blob = pickle.dumps(val)
  with _db_lock:
    conn = _cache_db()
    conn.execute(f"INSERT OR REPLACE INTO {_table(conn, table)} (key, val) VALUES (?, ?)", (_key(key), blob))
  return val

def diskcache_items(table: str) -> list[tuple[str, Any]]:
  """Every (hashed key, value) of table."""
  with _db_lock:
    conn = _cache_db()
    rows = conn.execute(f"SELECT key, val FROM {_table(conn, table)}").fetchall()
  return [(k, pickle.loads(v)) for k, v in rows]

def _key(key: Any) -> str: return key if isinstance(key, str) else hashlib.sha256(repr(key).encode()).hexdigest()

def diskcache(func: Callable[..., T]) -> Callable[..., T]:
  """Memoize a function of repr-able arguments on disk."""
  table = f"cache_{func.__name__}"
  @functools.wraps(func)
  def wrapper(*args: Any, **kwargs: Any) -> T:
    key = (args, sorted(kwargs.items()))
    if (ret := diskcache_get(table, key)) is not None: return ret
    return diskcache_put(table, key, func(*args, **kwargs))
  return wrapper

def temp_path(name: str) -> str: return os.path.join(tempfile.gettempdir(), name)
