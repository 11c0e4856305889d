# Two entry points (see README): `make demo` runs the main job, `make test` runs the tests.
# Both set everything up first, from nothing, into .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_TESTED := 2.13.0

.PHONY: setup demo test labs check-labs clean

setup: $(VENV)/.perflab-installed

# --system-site-packages keeps a torch the user already has (e.g. their own CUDA build);
# the tested torch is installed only when none imports.
$(VENV)/.perflab-installed: pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "torch==$(TORCH_TESTED)"
	$(PY) -m pip install -e ".[dev]"
	touch $@

demo: setup
	$(VENV)/bin/perflab doctor
	$(VENV)/bin/perflab data
	$(VENV)/bin/perflab run --preset quick

test: setup
	$(VENV)/bin/perflab data --quiet
	$(PY) -m pytest

labs: setup
	$(VENV)/bin/perflab course build

check-labs: setup
	$(VENV)/bin/perflab course build --check

clean:
	rm -rf $(VENV) results data/photo-patches
