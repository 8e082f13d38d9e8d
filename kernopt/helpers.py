"""Small pure helpers, the one config object for every knob, and the on-disk cache.
Imports only the standard library."""
from __future__ import annotations
import base64, binascii, contextlib, contextvars, functools, hashlib, json, os, re, socket, sqlite3, stat, sys
import tempfile, threading, warnings
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
  """text wrapped in an ANSI colour; an upper-case colour name selects the bright variant. (What is printed goes
  through kernopt.debug, which strips the escapes unless the stream is a terminal and NO_COLOR is unset.)"""
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
  CPU_MARCH: str = ""   # the CPU device's -march and ISA facts: x86-64-v2, x86-64-v3, x86-64-v4 or native (the default)
  CL_DEVICE: str = ""
  FUZZ_N: int = 0
  SAVE_ASTS: str = ""   # a directory: every AST a Kernel is built from is saved there as <digest>.json
  COMPILE_TIMEOUT: float = 0.0   # seconds a device compiler may run before its build fails (0, <0, inf, nan: no limit)

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

# ***** what this process did: lowerings, renders, compiles and cache hits (kernopt.stats(), DEBUG=1) *****

STATS: dict[str, int] = {}
_stats_lock = threading.Lock()

_thread_stats = threading.local()   # the same counts, per thread (what DEBUG=1 reports for the kernel it builds)

def count(event: str, n: int = 1) -> None:
  with _stats_lock: STATS[event] = STATS.get(event, 0) + n
  mine = _thread_stats.__dict__
  mine[event] = mine.get(event, 0) + n

def take_thread_counts() -> dict[str, int]:
  """The events this thread counted since its last call (and forget them)."""
  ret = dict(_thread_stats.__dict__)
  _thread_stats.__dict__.clear()
  return ret

@functools.lru_cache(None)
def source_digest() -> str:
  """sha256 of kernopt's own source files, computed once per process: part of every cache key whose value kernopt's
  code produced (a changed kernopt never serves an old Program)."""
  root = os.path.dirname(os.path.abspath(__file__))
  h = hashlib.sha256()
  for folder, dirs, files in sorted(os.walk(root)):
    dirs[:] = sorted(d for d in dirs if d != "__pycache__")
    for name in sorted(f for f in files if f.endswith(".py")):
      path = os.path.join(folder, name)
      h.update(os.path.relpath(path, root).encode() + b"\0")
      with open(path, "rb") as f: h.update(f.read() + b"\0")
  return h.hexdigest()

# ***** the on-disk cache *****
# Values are JSON (tuples and bytes tagged), never pickled: a database found on disk is data, not code. The cache
# directory must be private (ours, not writable by group or others; created 0700 whatever the umask) and the database
# 0600. An unfit directory or a database that can't be opened, read or written gives one warning and kernopt carries
# on without it; a corrupt database is rebuilt.

_db_lock = threading.Lock()
_db_conns: dict[tuple[str, int], sqlite3.Connection] = {}
_db_broken: dict[str, str] = {}   # database path -> why this process no longer uses it
_warned: set[tuple[str, str]] = set()
CACHE_VERSION = 2   # 1 pickled its values

def cache_warning(where: str, why: str, kind: str = "unfit") -> None:
  """Warn once per process and (where, kind) that the disk cache at where is not used, and why."""
  if (where, kind) in _warned: return
  _warned.add((where, kind))
  warnings.warn(f"kernopt disk cache {where}: {why}; carrying on without it", RuntimeWarning, stacklevel=3)

def unfit(st: os.stat_result, what: str) -> Optional[str]:
  """Why a cache file or directory with stat st may not be trusted (another owner, writable by group or others)."""
  uid = os.getuid() if hasattr(os, "getuid") else st.st_uid
  if st.st_uid != uid: return f"{what} is owned by uid {st.st_uid}, not by this user (uid {uid})"
  if st.st_mode & 0o022: return f"{what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
  return None

def private_dir(path: str) -> Optional[str]:
  """Create directory path and its missing parents with mode 0700 (whatever the umask); None when path is fit for a
  cache (a directory of this user's that group and others can't write), else why not."""
  path = os.path.abspath(path)
  todo = []
  p = path
  while not os.path.lexists(p) and os.path.dirname(p) != p:
    todo.append(p)
    p = os.path.dirname(p)
  try:
    for d in reversed(todo):
      try:
        os.mkdir(d, 0o700)
        os.chmod(d, 0o700)
      except FileExistsError: pass   # another process made it: checked below like any existing directory
    st = os.stat(path)
  except OSError as e: return f"cannot create it ({e.strerror or e})"
  if not stat.S_ISDIR(st.st_mode): return "it is not a directory"
  return unfit(st, "the directory")

def cache_subdir(name: str = "") -> Optional[str]:
  """cache_dir/name made private (see private_dir), or None after one warning when it or cache_dir is unfit."""
  root = getconfig().cache_dir
  for d in (root, os.path.join(root, name)) if name else (root,):
    if (why := private_dir(d)) is not None:
      cache_warning(d, why)
      return None
  return os.path.join(root, name) if name else root

def _is_corrupt(e: BaseException) -> bool:
  """Whether e says the file is not (or no longer) a database: SQLITE_CORRUPT or SQLITE_NOTADB."""
  return isinstance(e, sqlite3.DatabaseError) and ((getattr(e, "sqlite_errorcode", 0) & 0xFF) in (11, 26) or
                                                  not isinstance(e, sqlite3.OperationalError))

def _open_db(path: str) -> sqlite3.Connection:
  fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
  try:
    if (why := unfit(os.fstat(fd), "the database")) is not None: raise PermissionError(why)
    os.fchmod(fd, 0o600)   # sqlite gives its -wal and -shm files the database's mode
  finally: os.close(fd)
  conn = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False)
  try:
    conn.execute("PRAGMA busy_timeout=60000")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
  except BaseException:
    conn.close()
    raise
  return conn

def _remove_db(path: str) -> None:
  for key in [k for k in _db_conns if k[0] == path]: _db_conns.pop(key).close()
  for f in (path, path + "-wal", path + "-shm"):
    with contextlib.suppress(FileNotFoundError): os.unlink(f)

def _cache_db() -> Optional[tuple[str, sqlite3.Connection]]:
  """(path, this process's connection) of the cache database (call with _db_lock held), or None when there is none
  to use."""
  if (root := cache_subdir()) is None: return None
  path = os.path.join(root, f"cache_v{CACHE_VERSION}.db")
  if path in _db_broken: return None
  if (conn := _db_conns.get((path, os.getpid()))) is not None: return path, conn
  for attempt in range(2):
    try:
      conn = _db_conns[(path, os.getpid())] = _open_db(path)
      return path, conn
    except (sqlite3.Error, OSError) as e:
      if attempt == 0 and _is_corrupt(e):
        cache_warning(path, f"corrupt ({e}), rebuilt", "corrupt")
        with contextlib.suppress(OSError): _remove_db(path)
        continue
      _db_broken[path] = why = f"cannot open it ({type(e).__name__}: {e})"
      cache_warning(path, why)
  return None

def _db_call(fn: Callable[[sqlite3.Connection], T]) -> Optional[T]:
  """fn(connection) under the lock; None when there is no database or fn fails (one warning; a database found
  corrupt is removed, to be rebuilt on the next call)."""
  with _db_lock:
    if (db := _cache_db()) is None: return None
    path, conn = db
    try: return fn(conn)
    except (sqlite3.Error, OSError) as e:
      if _is_corrupt(e):
        cache_warning(path, f"corrupt ({e}), rebuilt", "corrupt")
        with contextlib.suppress(OSError): _remove_db(path)
      else: cache_warning(path, f"{type(e).__name__}: {e}", "error")
      return None

def _table(conn: sqlite3.Connection, table: str) -> str:
  if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", table): raise ValueError(f"bad cache table name {table!r}")
  conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (key TEXT PRIMARY KEY, val TEXT)")
  return table

_TAGS = ("__tuple__", "__bytes__", "__dict__")

def to_json(v: Any) -> Any:
  """v as plain JSON data: tuples and bytes become one-key tagged objects (a dict that looks like a tag is wrapped)."""
  if v is None or isinstance(v, (bool, int, float, str)): return v
  if isinstance(v, tuple): return {"__tuple__": [to_json(x) for x in v]}
  if isinstance(v, list): return [to_json(x) for x in v]
  if isinstance(v, (bytes, bytearray)): return {"__bytes__": base64.b64encode(v).decode()}
  if isinstance(v, dict) and all(isinstance(k, str) for k in v):
    d = {k: to_json(x) for k, x in v.items()}
    return {"__dict__": d} if len(d) == 1 and next(iter(d)) in _TAGS else d
  raise TypeError(f"the disk cache stores None, bool, int, float, str, bytes, lists, tuples and str-keyed dicts, "
                  f"not {type(v).__name__}")

def from_json(v: Any) -> Any:
  """The inverse of to_json; ValueError for a tagged object of the wrong shape."""
  if isinstance(v, list): return [from_json(x) for x in v]
  if not isinstance(v, dict): return v
  if len(v) == 1 and (tag := next(iter(v))) in _TAGS:
    x = v[tag]
    if tag == "__bytes__" and isinstance(x, str): return base64.b64decode(x, validate=True)
    if tag == "__tuple__" and isinstance(x, list): return tuple(from_json(y) for y in x)
    if tag == "__dict__" and isinstance(x, dict): return {k: from_json(y) for k, y in x.items()}
    raise ValueError(f"malformed {tag} entry")
  return {k: from_json(x) for k, x in v.items()}

def _loads(text: Any) -> Any:
  """A stored value, or None (a miss) for one that is not what to_json wrote."""
  try: return from_json(json.loads(text)) if isinstance(text, str) else None
  except (ValueError, TypeError, RecursionError, binascii.Error): return None

def diskcache_get(table: str, key: Any) -> Any:
  """The value stored under key in table, or None. Keys are hashed with their repr."""
  if getconfig().DISABLE_CACHE: return None
  def get(conn: sqlite3.Connection) -> Any:
    return conn.execute(f"SELECT val FROM {_table(conn, table)} WHERE key=?", (_key(key),)).fetchone()
  row = _db_call(get)
  return _loads(row[0]) if row else None

def diskcache_put(table: str, key: Any, val: Any) -> Any:
  """Store val (see to_json) under key in table (safe with several processes: sqlite WAL + busy timeout); returns
  val. A failed write (a read-only or full disk) is one warning, not an error."""
  if getconfig().DISABLE_CACHE: return val
  text = json.dumps(to_json(val))
  def put(conn: sqlite3.Connection) -> None:
    conn.execute(f"INSERT OR REPLACE INTO {_table(conn, table)} (key, val) VALUES (?, ?)", (_key(key), text))
  _db_call(put)
  return val

def diskcache_items(table: str) -> list[tuple[str, Any]]:
  """Every (hashed key, value) of table (values that don't decode are left out)."""
  rows = _db_call(lambda conn: conn.execute(f"SELECT key, val FROM {_table(conn, table)}").fetchall()) or []
  return [(k, v) for k, text in rows if (v := _loads(text)) is not None]

def diskcache_get_many(table: str, keys: Sequence[Any]) -> dict[str, Any]:
  """{hashed key: value} for those of keys that table holds (a few queries, not one per key)."""
  if getconfig().DISABLE_CACHE or not keys: return {}
  hashed = [_key(k) for k in keys]
  def get(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    t, rows = _table(conn, table), []
    for i in range(0, len(hashed), 500):
      part = hashed[i:i + 500]
      rows += conn.execute(f"SELECT key, val FROM {t} WHERE key IN ({','.join('?' * len(part))})", part).fetchall()
    return rows
  return {k: v for k, text in _db_call(get) or [] if (v := _loads(text)) is not None}

def diskcache_put_many(table: str, items: Sequence[tuple[Any, Any]], plain: bool = False) -> int:
  """Store every (key, val) of items in one transaction (all or none); the number stored (0 when the cache is off or
  the write failed, with one warning as for diskcache_put). `plain`: every val is already plain JSON data (no tuples
  or bytes, no dict with one key "__tuple__", "__bytes__" or "__dict__"), stored as it is."""
  if getconfig().DISABLE_CACHE or not items: return 0
  rows = [(_key(k), json.dumps(v if plain else to_json(v))) for k, v in items]
  def put(conn: sqlite3.Connection) -> int:
    t = _table(conn, table)
    conn.execute("BEGIN IMMEDIATE")
    try:
      conn.executemany(f"INSERT OR REPLACE INTO {t} (key, val) VALUES (?, ?)", rows)
      conn.execute("COMMIT")
    except BaseException:
      with contextlib.suppress(sqlite3.Error): conn.execute("ROLLBACK")
      raise
    return len(rows)
  return _db_call(put) or 0

def diskcache_trim(table: str, keep: int) -> int:
  """Drop all but the `keep` most recently written entries of table (a re-put moves an entry to the end: writing back
  each hit makes this least-recently-used eviction); the number dropped."""
  if getconfig().DISABLE_CACHE: return 0
  def trim(conn: sqlite3.Connection) -> int:
    t = _table(conn, table)
    cur = conn.execute(f"DELETE FROM {t} WHERE rowid IN (SELECT rowid FROM {t} ORDER BY rowid DESC LIMIT -1 OFFSET ?)",
                       (keep,))
    return cur.rowcount
  return _db_call(trim) or 0

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

# ***** binaries in the cache, verified before use *****

def record_binary(table: str, path: str, src: str, binary: bytes) -> None:
  """Note in table that the cache file at path holds binary, built from src (their sha256 and the size)."""
  diskcache_put(table, os.path.basename(path), {"src_sha256": hashlib.sha256(src.encode()).hexdigest(),
                                                "bin_sha256": hashlib.sha256(binary).hexdigest(), "size": len(binary)})

def verified_binary(table: str, path: str, src: str) -> Optional[bytes]:
  """The bytes of the cache file at path when table's record says they were built from src and they are exactly the
  recorded ones (not truncated, not another kernel's); else None."""
  rec = diskcache_get(table, os.path.basename(path))
  if not isinstance(rec, dict) or rec.get("src_sha256") != hashlib.sha256(src.encode()).hexdigest(): return None
  try:
    with open(path, "rb") as f: binary = f.read()
  except OSError: return None
  return binary if len(binary) == rec.get("size") and hashlib.sha256(binary).hexdigest() == rec.get("bin_sha256") \
    else None

# ***** temporary files beside cache entries *****
# `<entry>.<host>.<pid>.<random>.tmp`: written, then renamed over the entry; one left by a process of this host that is
# gone (killed mid-write) is removed by the next writer in the folder, one of a live process never.

_TMP = re.compile(r"\.([0-9a-f]{8})\.(\d+)\.[A-Za-z0-9_]+\.tmp$")

@functools.lru_cache(None)
def _host_tag() -> str: return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]

def cache_tmp(path: str) -> str:
  """A new empty file (mode 0600) beside path, named for this host and process, to be renamed over path."""
  folder, base = os.path.split(path)
  fd, tmp = tempfile.mkstemp(prefix=f"{base}.{_host_tag()}.{os.getpid()}.", suffix=".tmp", dir=folder)
  os.close(fd)
  return tmp

def _alive(pid: int) -> bool:
  if pid == os.getpid(): return True
  try: os.kill(pid, 0)
  except ProcessLookupError: return False
  except OSError: return True   # EPERM: it exists, as another user's
  try:   # a zombie (killed, not yet reaped) writes nothing more
    with open(f"/proc/{pid}/stat") as f: return f.read().rpartition(")")[2].split()[0] != "Z"
  except (OSError, IndexError): return True

def remove_stale_tmp(folder: str) -> list[str]:
  """Remove the temporary files in folder whose writer (a process of this host) is gone; the names removed."""
  removed: list[str] = []
  try: names = os.listdir(folder)
  except OSError: return removed
  for name in names:
    if (m := _TMP.search(name)) is None or m.group(1) != _host_tag() or _alive(int(m.group(2))): continue
    with contextlib.suppress(OSError):
      os.unlink(os.path.join(folder, name))
      removed.append(name)
  return removed
