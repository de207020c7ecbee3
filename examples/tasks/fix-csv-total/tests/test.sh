#!/bin/bash
# Verifier: reward 1 when every unit test in /tests passes against /app, else 0.
mkdir -p /logs/verifier
cd /app
if PYTHONPATH=/app python3 -m unittest discover -s /tests -p 'test_*.py' > /logs/verifier/unittest.log 2>&1; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
