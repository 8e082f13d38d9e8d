"""The tuning cache's export and import: a file that is not a tuning cache is a TuningCacheError with a message,
malformed entries are skipped and counted, the rest is merged in one transaction, a local validated entry is kept."""
import hashlib
import json
import pytest
from kernopt import search as S
from kernopt.errors import KernoptError, TuningCacheError
from kernopt.helpers import config_override, diskcache_get_many, diskcache_put, diskcache_put_many

def key(i) -> str: return "tune-" + hashlib.sha256(str(i).encode()).hexdigest()

def entry(**kw) -> dict:
  return {"opts": [["UPCAST", 0, 4], ["NOLOCALS", None, None]], "validated": True, "time_s": 1e-5, "baseline_s": None,
          "searched_at": 1.0, "complete": True, "budget_s": None, "imported": False, "device": "CPU", "kernel": "E_4",
          "compiled": 3, "timed": 3, **kw}

def export(tmp_path, entries, name="t.json", **top) -> str:
  path = tmp_path / name
  path.write_text(json.dumps({"format": "kernopt-tuning", "version": 1, "entries": entries, **top}))
  return str(path)

@pytest.mark.parametrize("text,match", [
  ("{not json", "not UTF-8 JSON"), (b"\xff\xfe\x00garbage", "not UTF-8 JSON"), ("[" * 100000, "nested too deeply"),
  ("[1, 2]", "not a kernopt tuning export.*list"), ('"x"', "not a kernopt tuning export"), ("{}", "tuning export"),
  ('{"format": "kernopt-tuning", "version": 2, "entries": {}}', "version 1"),
  ('{"format": "kernopt-tuning", "version": 1, "entries": [1]}', "'entries' is a list"),
])
def test_a_file_that_is_not_a_tuning_cache(tmp_path, text, match):
  p = tmp_path / "bad.json"
  if isinstance(text, bytes): p.write_bytes(text)
  else: p.write_text(text)
  with config_override(CACHE_DIR=str(tmp_path / "c")), pytest.raises(TuningCacheError, match=match) as e:
    S.import_cache(str(p))
  assert isinstance(e.value, KernoptError) and isinstance(e.value, ValueError)

def test_a_missing_file_and_an_unwritable_export(tmp_path):
  with config_override(CACHE_DIR=str(tmp_path / "c")):
    with pytest.raises(TuningCacheError, match="cannot read tuning cache"): S.import_cache(str(tmp_path / "none.json"))
    with pytest.raises(TuningCacheError, match="cannot write tuning cache"): S.export_cache(str(tmp_path / "no/x.json"))

def deep(n: int):
  x: list = []
  for _ in range(n): x = [x]
  return x

BAD = {"not-a-key": entry(), key("list"): [1, 2], key("noopts"): {"validated": True},
       key("opname"): entry(opts=[["FAST", 0, 4]]), key("axis"): entry(opts=[["UPCAST", True, 4]]),
       key("arity"): entry(opts=[["UPCAST", 0]]), key("neg"): entry(opts=[["UPCAST", -1, 4]]),
       key("nested"): entry(opts=[["UPCAST", 0, deep(500)]]), key("field"): entry(validated="yes"),
       key("time"): entry(time_s=float("nan")), key("dev"): entry(device=7)}

def test_bad_entries_are_skipped_and_counted(tmp_path):
  good = {key(i): entry(time_s=i * 1e-6, junk=deep(300)) for i in range(5)}
  path = export(tmp_path, {**good, **BAD})
  with config_override(CACHE_DIR=str(tmp_path / "c")):
    with pytest.warns(RuntimeWarning, match=f"skipped {len(BAD)} malformed entries"): assert S.import_cache(path) == 5
    got = diskcache_get_many(S.TUNING_TABLE, list(good) + list(BAD))
    assert set(got) == set(good)
    for k, e in got.items():
      assert e["imported"] and not e["validated"] and e["time_s"] == good[k]["time_s"] and "junk" not in e

def test_a_local_validated_entry_is_kept_and_the_round_trip(tmp_path):
  entries = {key(i): entry(time_s=float(i)) for i in range(10)}
  with config_override(CACHE_DIR=str(tmp_path / "a")):
    assert diskcache_put_many(S.TUNING_TABLE, list(entries.items())) == 10
    assert S.export_cache(str(tmp_path / "out.json")) == 10
  with config_override(CACHE_DIR=str(tmp_path / "b")):
    diskcache_put(S.TUNING_TABLE, key(3), entry(time_s=42.0))   # searched here: validated, not imported
    assert S.import_cache(str(tmp_path / "out.json")) == 9
    got = diskcache_get_many(S.TUNING_TABLE, list(entries))
    assert got[key(3)]["time_s"] == 42.0 and not got[key(3)]["imported"]
    assert all(got[k]["imported"] and got[k]["time_s"] == e["time_s"] for k, e in entries.items() if k != key(3))

def test_import_is_one_transaction(tmp_path, monkeypatch):
  calls = []
  monkeypatch.setattr(S, "diskcache_put", lambda *a: calls.append(a))   # never one write per entry
  with config_override(CACHE_DIR=str(tmp_path / "c")):
    assert S.import_cache(export(tmp_path, {key(i): entry() for i in range(2000)})) == 2000
  assert calls == []

def test_put_many_is_all_or_nothing(tmp_path):
  with config_override(CACHE_DIR=str(tmp_path)):
    with pytest.raises(TypeError): diskcache_put_many("t", [(key(1), 1), (key(2), object())])
    assert diskcache_get_many("t", [key(1), key(2)]) == {}
    with config_override(DISABLE_CACHE=1): assert diskcache_put_many("t", [(key(1), 1)]) == 0
    assert diskcache_get_many("t", [key(1)]) == {}
