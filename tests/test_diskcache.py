"""The on-disk cache: JSON values (never unpickled), private directories (0700) and database (0600) whatever the umask,
a directory or database of another user's or writable by others not used (one warning), and a corrupt, unreadable,
read-only or full database one warning and no error. Tests run as root, which ignores mode bits: ownership is real
(chown to nobody) or simulated (os.getuid), and failures are injected."""
import os
import pickle
import sqlite3
import stat
import warnings
import pytest
from kernopt import helpers
from kernopt.helpers import config_override, diskcache_get, diskcache_items, diskcache_put, from_json, to_json

NOBODY = 65534

def db_path(root) -> str: return os.path.join(str(root), f"cache_v{helpers.CACHE_VERSION}.db")

def mode(path) -> int: return stat.S_IMODE(os.stat(path).st_mode)

def close(root) -> None:
  """Drop this process's connections to root's database, as a new process would start."""
  with helpers._db_lock:
    for key in [k for k in helpers._db_conns if k[0] == db_path(root)]: helpers._db_conns.pop(key).close()

@pytest.mark.parametrize("val", [("gcc 12", ("-march=native",), "x86-64"), (), [1, (2, 3), [4]], b"\x7fELF\x00\xff",
                                 {"__tuple__": [1]}, {"__bytes__": "x", "a": (1,)}, {"opts": [["UPCAST", 0, 4]],
                                 "t": float("inf"), "n": None, "ok": True}, "s", 1.5, -3])
def test_json_round_trip_keeps_tuples_and_bytes(val):
  assert from_json(to_json(val)) == val and type(from_json(to_json(val))) is type(val)

def test_unstorable_values_raise_type_error():
  with pytest.raises(TypeError, match="set"): to_json({1, 2})
  with pytest.raises(TypeError): to_json({1: "int key"})

def test_values_survive_a_new_connection(tmp_path):
  with config_override(CACHE_DIR=str(tmp_path)):
    diskcache_put("t", ("k", 1), ("gcc", ("-O2",), b"\x00\x01"))
    close(tmp_path)
    assert diskcache_get("t", ("k", 1)) == ("gcc", ("-O2",), b"\x00\x01")

def test_nothing_is_unpickled(tmp_path):
  """A planted row holding a pickle that would run a command is a miss, and the command never runs."""
  marker = tmp_path / "pwned"
  class Evil:
    def __reduce__(self): return (os.system, (f"touch {marker}",))
  with config_override(CACHE_DIR=str(tmp_path)):
    diskcache_put("t", "k", 1)
    with sqlite3.connect(db_path(tmp_path)) as conn:
      conn.execute("INSERT OR REPLACE INTO t (key, val) VALUES (?, ?)", ("k", pickle.dumps(Evil())))
      conn.execute("INSERT OR REPLACE INTO t (key, val) VALUES (?, ?)", ("j", "{not json"))
      conn.execute("INSERT OR REPLACE INTO t (key, val) VALUES (?, ?)", ("d", '{"__bytes__": 5}'))
      conn.execute("INSERT OR REPLACE INTO t (key, val) VALUES (?, ?)", ("r", "[" * 100000 + "]" * 100000))
    assert [diskcache_get("t", k) for k in ("k", "j", "d", "r")] == [None] * 4
    assert diskcache_items("t") == []
  assert not marker.exists() and "pickle" not in vars(helpers)

def test_directories_0700_and_database_0600_under_umask_0(tmp_path):
  root = tmp_path / "a" / "b" / "kernopt"
  old = os.umask(0)
  try:
    with config_override(CACHE_DIR=str(root)):
      diskcache_put("t", "k", [1])
      assert diskcache_get("t", "k") == [1]
      assert helpers.cache_subdir("cpu") == str(root / "cpu")
  finally: os.umask(old)
  for d in (tmp_path / "a", tmp_path / "a" / "b", root, root / "cpu"): assert mode(d) == 0o700, d
  for f in (db_path(root), db_path(root) + "-wal", db_path(root) + "-shm"):
    if os.path.exists(f): assert mode(f) == 0o600, f

def _one_warning(record, *words) -> str:
  msgs = [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)]
  assert len(msgs) == 1, msgs
  assert all(w in msgs[0] for w in words), msgs[0]
  return msgs[0]

def _unused(root, dir_unfit: bool = True) -> list:
  """The cache at root is not used: gets miss, puts return their value; the recorded warnings."""
  with config_override(CACHE_DIR=str(root)):
    with warnings.catch_warnings(record=True) as rec:
      warnings.simplefilter("always")
      for _ in range(3):
        assert diskcache_put("t", "k", 7) == 7
        assert diskcache_get("t", "k") is None
    if dir_unfit: assert helpers.cache_subdir("cpu") is None
  return rec

def test_directory_of_another_user_is_not_used(tmp_path):
  root = tmp_path / "theirs"
  root.mkdir(mode=0o700)
  os.chown(root, NOBODY, NOBODY)
  rec = _unused(root)
  _one_warning(rec, str(root), f"owned by uid {NOBODY}")
  assert os.listdir(root) == []

def test_directory_writable_by_others_is_not_used(tmp_path):
  root = tmp_path / "open"
  root.mkdir()
  os.chmod(root, 0o777)
  _one_warning(_unused(root), str(root), "writable by group or others", "0777")
  assert os.listdir(root) == []

def test_ownership_check_with_a_simulated_user(tmp_path, monkeypatch):
  """The same check with this process pretending to be another user: the directory root made is no longer ours."""
  root = tmp_path / "mine"
  assert helpers.private_dir(str(root)) is None
  monkeypatch.setattr(os, "getuid", lambda: 4242)
  assert "owned by uid 0" in helpers.private_dir(str(root))
  _one_warning(_unused(root), str(root), "not by this user (uid 4242)")

def test_database_of_another_user_is_not_used(tmp_path):
  root = tmp_path / "c"
  with config_override(CACHE_DIR=str(root)): diskcache_put("t", "k", 1)
  close(root)
  os.chown(db_path(root), NOBODY, NOBODY)
  _one_warning(_unused(root, False), db_path(root), f"owned by uid {NOBODY}")

def test_corrupt_database_is_rebuilt(tmp_path):
  root = tmp_path / "c"
  helpers.private_dir(str(root))
  with open(db_path(root), "wb") as f: f.write(os.urandom(4096))
  with config_override(CACHE_DIR=str(root)), warnings.catch_warnings(record=True) as rec:
    warnings.simplefilter("always")
    assert diskcache_get("t", "k") is None
    diskcache_put("t", "k", (1, 2))
    assert diskcache_get("t", "k") == (1, 2)
  _one_warning(rec, db_path(root), "corrupt", "rebuilt")
  with sqlite3.connect(db_path(root)) as conn: assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)

def test_unopenable_database_is_one_warning(tmp_path, monkeypatch):
  """A read-only or unreadable database (root can't be refused by mode bits: injected)."""
  def refuse(path): raise sqlite3.OperationalError("attempt to write a readonly database")
  monkeypatch.setattr(helpers, "_open_db", refuse)
  _one_warning(_unused(tmp_path / "ro", False), "readonly database", db_path(tmp_path / "ro"))
  def unreadable(path): raise PermissionError(13, "Permission denied", path)
  monkeypatch.setattr(helpers, "_open_db", unreadable)
  _one_warning(_unused(tmp_path / "noread", False), "Permission denied")

class _FullDisk:
  """A connection whose writes fail as on a full disk."""
  def __init__(self, conn): self.conn = conn
  def execute(self, sql, *args):
    if sql.startswith("INSERT"): raise sqlite3.OperationalError("database or disk is full")
    return self.conn.execute(sql, *args)

def test_full_disk_is_one_warning_and_reads_go_on(tmp_path):
  with config_override(CACHE_DIR=str(tmp_path)):
    diskcache_put("t", "old", 1)
    key = (db_path(tmp_path), os.getpid())
    helpers._db_conns[key] = _FullDisk(helpers._db_conns[key])
    try:
      with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for i in range(3): assert diskcache_put("t", f"new{i}", 2) == 2
        assert diskcache_get("t", "old") == 1 and diskcache_get("t", "new0") is None
      _one_warning(rec, "database or disk is full")
    finally: helpers._db_conns[key] = helpers._db_conns[key].conn

def test_a_file_where_the_directory_should_be(tmp_path):
  (tmp_path / "f").write_text("x")
  _one_warning(_unused(tmp_path / "f"), "not a directory")
  _one_warning(_unused(tmp_path / "f" / "sub"), "cannot create it")
