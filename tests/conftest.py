"""Test setup: tests/ on sys.path (for `import catalogue`) and a private on-disk cache for this session, set before
kernopt reads the environment (kernopt.helpers reads it once, at import)."""
import atexit
import os
import shutil
import sys
import tempfile

_cache = tempfile.mkdtemp(prefix="kernopt-test-cache-")
os.environ["XDG_CACHE_HOME"] = _cache
atexit.register(shutil.rmtree, _cache, ignore_errors=True)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
