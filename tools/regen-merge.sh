#!/usr/bin/env bash
# After merging notebook branches: regenerate the files nbdev derives from all notebooks
# (stalebook/_modidx.py, stalebook/__init__.py, nbs/llms.txt) instead of hand-merging them.
set -euo pipefail
cd "$(dirname "$0")/.."
for f in stalebook/_modidx.py stalebook/__init__.py nbs/llms.txt; do git checkout --ours -- "$f" 2>/dev/null || true; done
.venv/bin/nbdev-export
.venv/bin/nbdev-clean
git add stalebook/_modidx.py stalebook/__init__.py nbs/llms.txt
