# Two entry points (see README): `make demo` runs the main job, `make test` runs the tests.
# Both set everything up first, from nothing, into .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_TESTED := 2.13.0
SUBMISSIONS ?= submissions

.PHONY: setup demo test labs check-labs check-solutions test-browser grade clean

setup: $(VENV)/.perflab-installed

# --system-site-packages keeps a torch the user already has (e.g. their own CUDA build);
# the tested torch is installed only when none imports.
$(VENV)/.perflab-installed: pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "torch==$(TORCH_TESTED)"
	$(PY) -m pip install -e ".[dev,browser]"
	touch $@

demo: setup
	$(VENV)/bin/perflab doctor
	$(VENV)/bin/perflab data
	$(VENV)/bin/perflab run --preset quick

# Unit tests, labs/ drift, grading, every lab in a real browser (skipped without
# chromium), then every solution under nbval; prints the wall time per notebook.
test: setup
	$(VENV)/bin/perflab data --quiet
	$(PY) -m pytest --durations=15

labs: setup
	$(VENV)/bin/perflab course build

check-labs: setup
	$(VENV)/bin/perflab course build --check

# The instructor's check of the kit on the course's own hardware.
check-solutions: setup
	$(VENV)/bin/perflab data --quiet
	$(PY) -m pytest --nbval-lax solutions/

test-browser: setup
	$(VENV)/bin/perflab data --quiet
	$(PY) -m pytest tests/browser

# make grade SUBMISSIONS=path/to/submissions  ->  scores.csv and feedback/
grade: setup
	$(VENV)/bin/perflab data --quiet
	$(VENV)/bin/perflab course grade $(SUBMISSIONS) --reference solutions --out scores.csv

clean:
	rm -rf $(VENV) results data/photo-patches test-output
