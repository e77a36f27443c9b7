# Two entry points for a fresh machine: `make train` and `make test`. Both build the venv first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup train test test-fast lint

setup: $(STAMP)

# The exact versions from requirements.lock (no dependency resolution), then the project itself.
$(STAMP): pyproject.toml requirements.lock
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps -e .
	touch $@

train: $(STAMP)
	$(PY) -m train

# Three workers (pytest-xdist) on two cores: the Slurm tests one after another on one worker (their xdist_group,
# tests/conftest.py), whose waits on the cluster (a scheduler tick, a time limit) the other two fill; it goes on to
# the other tests once they are done.
WORKERS ?= 3
XDIST = -n $(WORKERS) --dist loadgroup

# Tests submit real jobs to a loopback Slurm that the project starts itself (and stops afterwards). The 20
# slowest tests are listed at the end: where the suite's time goes.
test: $(STAMP)
	bash scripts/slurm-local.sh start
	eval "$$(bash scripts/slurm-local.sh status)" && $(PY) -m pytest -q $(XDIST) --durations=20 $(PYTEST_ARGS); \
	  rc=$$?; bash scripts/slurm-local.sh stop; exit $$rc

# The fast tier for your own loop (under a minute): config, checks, plan, README lines and data_prep units; no
# training, no Slurm, no data_prep end-to-end runs (markers in pyproject.toml).
test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup -m "not slurm and not train and not e2e and not torch and not table" $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
