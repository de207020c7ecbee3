#!/usr/bin/env bash
# Create the out-of-process Harbor env (Harbor needs Python >= 3.12; asyncrl runs on 3.11).
#
#   scripts/setup_harbor_env.sh [VENV_DIR]        default: .venv-harbor (git-ignored)
#
# The interpreter is $HARBOR_PYTHON, else the first python3.13/python3.12 on PATH, else a pyenv
# 3.12/3.13 install. asyncrl finds the env through $ASYNCRL_HARBOR_PYTHON or <repo>/.venv-harbor.
# The env gets `harbor` only; our sandbox environment plugin is imported from this checkout via
# PYTHONPATH at run time (asyncrl/agent_loop/sandbox/harbor_plugin.py needs nothing but the stdlib
# and harbor).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-harbor}"
HARBOR_SPEC="${HARBOR_SPEC:-harbor}"

usable() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; }

find_python() {
  if [[ -n "${HARBOR_PYTHON:-}" ]]; then echo "$HARBOR_PYTHON"; return; fi
  # pyenv shims exist for versions that are not active, so check that each candidate really runs.
  local c
  for c in python3.12 python3.13 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python \
           "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13*/bin/python; do
    if usable "$c"; then command -v "$c"; return; fi
  done
  return 1
}

PY="$(find_python)" || { echo "no Python >= 3.12 found; set HARBOR_PYTHON=/path/to/python3.12" >&2; exit 1; }
"$PY" -c 'import sys; assert sys.version_info >= (3, 12), sys.version' \
  || { echo "$PY is older than 3.12; Harbor needs >= 3.12" >&2; exit 1; }
echo "creating $VENV with $PY"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "$HARBOR_SPEC"
"$VENV/bin/python" -c 'import harbor, importlib.metadata as m; print("harbor", m.version("harbor"))'
