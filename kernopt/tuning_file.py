"""The tuning cache as one JSON file: `export_cache` writes every entry, `import_cache` merges a file's entries in
one transaction (marked imported, validated on first use), each checked field by field first so that a file from
anywhere can only add well-typed entries. Imports errors, helpers and opt."""
from __future__ import annotations
import contextlib
import json
import os
import re
import stat
import warnings
from typing import Any, Optional
from kernopt.errors import TuningCacheError
from kernopt.helpers import diskcache_get_many, diskcache_items, diskcache_put_many
from kernopt.opt import OptOps

TUNING_TABLE = "tuning"
EXPORT_FORMAT = "kernopt-tuning"
EXPORT_VERSION = 1

_KEY_RE = re.compile(r"tune-[0-9a-f]{64}")
_NUM, _BOOL, _STR = frozenset((int, float, type(None))), frozenset((bool,)), frozenset((str,))
_FIELDS = {"validated": _BOOL, "time_s": _NUM, "baseline_s": _NUM, "searched_at": _NUM, "complete": _BOOL,
           "budget_s": _NUM, "imported": _BOOL, "device": _STR, "kernel": _STR, "compiled": _NUM, "timed": _NUM}
_OPT_NAMES = frozenset(OptOps.__members__)

def _opt_ok(o: Any) -> bool:
  if type(o) is not list or len(o) != 3 or type(o[0]) is not str or o[0] not in _OPT_NAMES: return False
  return all(x is None or (type(x) is int and 0 <= x < 1 << 31) for x in (o[1], o[2]))

def _clean_entry(key: Any, entry: Any) -> tuple[Optional[dict], str]:
  """(the entry with only its known, well-typed fields, "") or (None, why it is not a tuning entry)."""
  if type(key) is not str or not _KEY_RE.fullmatch(key): return None, f"key {str(key)[:80]!r} is not a tuning key"
  if type(entry) is not dict: return None, f"entry {key[:16]} is a {type(entry).__name__}, not an object"
  opts = entry.get("opts")
  if type(opts) is not list or len(opts) > 64 or not all(map(_opt_ok, opts)):
    return None, f"entry {key[:16]} has no list of [op, axis, amt] opts"
  ret: dict[str, Any] = {"opts": [list(o) for o in opts]}
  for name, types in _FIELDS.items():
    if name in entry:
      v = entry[name]
      if type(v) not in types or v != v or (type(v) is str and len(v) > 4096):   # (v != v: NaN)
        return None, f"entry {key[:16]} has a bad {name!r}: {str(v)[:40]}"
      ret[name] = v
  return ret, ""

def _check_path(path: object, what: str) -> None:
  if not isinstance(path, (str, os.PathLike)):
    raise TuningCacheError(f"{what} takes a file path, got {type(path).__name__} {str(path)[:60]}")

MAX_EXPORT_BYTES = 1 << 30   # import_cache reads no more (a /dev/zero or a runaway file is refused, not read)

def _read_export(path: str) -> dict:
  """The entries object of a file export_cache wrote; TuningCacheError for anything else."""
  _check_path(path, "import_cache")
  try:
    with open(path, "rb") as f:
      if not stat.S_ISREG(os.fstat(f.fileno()).st_mode): raise TuningCacheError(f"{path} is not a regular file")
      raw = f.read(MAX_EXPORT_BYTES + 1)
    if len(raw) > MAX_EXPORT_BYTES: raise TuningCacheError(f"{path} is over {MAX_EXPORT_BYTES} bytes")
    data = json.loads(raw.decode("utf-8"))
  except TuningCacheError: raise
  except OSError as e: raise TuningCacheError(f"cannot read tuning cache {path}: {e.strerror or e}") from None
  except RecursionError: raise TuningCacheError(f"{path} is not a tuning cache: nested too deeply") from None
  except ValueError as e: raise TuningCacheError(f"{path} is not a tuning cache: not UTF-8 JSON ({e})") from None
  if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT or type(data.get("version")) is not int or \
     data.get("version") != EXPORT_VERSION:
    raise TuningCacheError(f"{path} is not a kernopt tuning export (format {EXPORT_FORMAT!r}, version "
                           f"{EXPORT_VERSION}); its top level is a {type(data).__name__}")
  if not isinstance(entries := data.get("entries", {}), dict):
    raise TuningCacheError(f"{path}: 'entries' is a {type(entries).__name__}, not an object")
  return entries

def export_cache(path: str) -> int:
  """Write every tuning entry to one JSON file {"format", "version", "entries": {key: entry}} (atomically); returns
  the count. TuningCacheError when the file can't be written."""
  _check_path(path, "export_cache")
  entries = {k: e for k, v in diskcache_items(TUNING_TABLE) if (e := _clean_entry(k, v)[0]) is not None}
  tmp = f"{path}.{os.getpid()}.tmp"
  try:
    with open(tmp, "w") as f:
      f.write(json.dumps({"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "entries": entries}, sort_keys=True))
    os.replace(tmp, path)
  except OSError as e:
    with contextlib.suppress(OSError): os.unlink(tmp)
    raise TuningCacheError(f"cannot write tuning cache {path}: {e.strerror or e}") from None
  return len(entries)

def import_cache(path: str) -> int:
  """Merge a file written by export_cache into this cache in one transaction, each entry marked imported (validated
  on first use); a local validated entry is kept. Entries that are not tuning entries are skipped, with one
  RuntimeWarning counting them. Returns the number of entries taken; TuningCacheError for a file that is not a
  tuning cache."""
  clean, bad = {}, []
  for key, entry in _read_export(path).items():
    e, why = _clean_entry(key, entry)
    if e is None: bad.append(why)
    else: clean[key] = e
  old = diskcache_get_many(TUNING_TABLE, list(clean))
  take = [(k, {**e, "imported": True, "validated": False}) for k, e in clean.items()
          if not (isinstance(o := old.get(k), dict) and o.get("validated") and not o.get("imported"))]
  if bad:
    warnings.warn(f"import_cache {path}: skipped {len(bad)} malformed entr{'y' if len(bad) == 1 else 'ies'} "
                  f"(first: {bad[0]})", RuntimeWarning, stacklevel=2)
  return diskcache_put_many(TUNING_TABLE, take, plain=True)
