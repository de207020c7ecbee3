#!/bin/bash
# Verifier: partial credit. Writes reward.json {"reward": passed/total, "tests_passed": n, "tests_total": N}.
mkdir -p /logs/verifier
cd /app
PYTHONPATH=/app python3 - <<'PY'
import json, sys, unittest
suite = unittest.defaultTestLoader.discover("/tests", pattern="test_*.py")
result = unittest.TextTestRunner(stream=open("/logs/verifier/unittest.log", "w"), verbosity=2).run(suite)
total = result.testsRun
passed = total - len(result.failures) - len(result.errors)
json.dump({"reward": passed / total if total else 0.0, "tests_passed": passed, "tests_total": total},
          open("/logs/verifier/reward.json", "w"))
PY
