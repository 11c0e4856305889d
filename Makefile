# Two entry points (see README): `make demo` runs the main job, `make test` runs the tests.
# Both set everything up first, from nothing, into .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_TESTED := 2.13.0
SUBMISSIONS ?= submissions

.PHONY: setup demo test test-fast labs check-labs check-solutions test-browser grade wheel-smoke release-smoke clean gpu-check

setup: $(VENV)/.perflab-installed

# --system-site-packages keeps a torch the user already has (e.g. their own CUDA build);
# the tested torch is installed only when none imports. A student needs only
# `pip install .`; this adds the course tooling, the test tools and the browser tests.
# When the tested torch was installed here (pip: the machine's pip configuration finds its
# wheel), uv installs the ~150 other packages, torch held at the installed version: it
# resolves, downloads and byte-compiles in parallel (the whole set-up: 70-85 s on a 2-core
# CI machine, 105 s with pip alone). uv does not see packages outside the venv, so with a
# torch of the user's own (outside .venv) pip installs the rest and keeps it. uv installs
# the newest release of each package into .venv (IPython 9, not a system's IPython 8).
# The kernel 'perflab' ("Python (perflab)") lets VS Code or another Jupyter use .venv.
$(VENV)/.perflab-installed: pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install \
		"torch==$(TORCH_TESTED)" "uv>=0.8"
	@if [ -x $(VENV)/bin/uv ] && $(PY) -c "import sys, torch; \
			mine = torch.__file__.startswith(sys.prefix); \
			mine and print(f'torch=={torch.__version__}'); sys.exit(not mine)" \
			> $(VENV)/torch-constraint.txt; then \
		echo "$(VENV)/bin/uv pip install -e .[dev,course,browser,kernels] (torch held)"; \
		$(VENV)/bin/uv pip install --python $(PY) --compile-bytecode \
			--constraint $(VENV)/torch-constraint.txt -e ".[dev,course,browser,kernels]"; \
	else \
		echo "$(PY) -m pip install -e .[dev,course,browser,kernels]"; \
		$(PY) -m pip install -e ".[dev,course,browser,kernels]"; \
	fi
	$(VENV)/bin/perflab kernel install
	touch $@

demo: setup
	$(VENV)/bin/perflab doctor
	$(VENV)/bin/perflab data
	$(VENV)/bin/perflab run --preset quick

# One pytest run shared by TEST_WORKERS pytest-xdist processes (default 2, this machine's
# cores): a whole file or notebook per worker, taken in the order tests/conftest.py
# sets (--no-loadscope-reorder: the solutions, then the test files that have a `slow`
# test, then the files with none, so the run ends on short files that fill whichever
# worker frees up first; xdist's default order, most tests first, left the 6-minute
# browser file for last); the run prints each file's time and each worker's end, one OpenMP
# thread per worker so the two do not oversubscribe the cores. Lab times are then printed,
# not saved (a lab sharing the cores did not take its own time: `make check-solutions`
# times them alone). TEST_WORKERS=0 runs serially: unit, grading and course tests, then
# the labs alone in one process (browser, then nbval), saving the lab times.
# Measured on 2 cores, quiet, wheel smoke alongside: 2 workers 1,022 s (1,148 s with
# xdist's default order); serially 1,360 s on CI.
# Two sandboxed gradings at once claim different slot uids (perflab.course.sandbox).
TEST_WORKERS ?= 2
test: setup
	$(VENV)/bin/perflab data --quiet
	@if [ "$(TEST_WORKERS)" = 0 ]; then \
		rc=0; \
		echo "== unit, grading and course tests"; \
		$(PY) -m pytest --durations=10 tests --ignore=tests/browser || rc=$$?; \
		echo "== the labs: in the browser, then under nbval (one process)"; \
		$(PY) -m pytest --durations=10 tests/browser solutions || rc=$$?; \
		exit $$rc; \
	else \
		OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(PY) -m pytest -n $(TEST_WORKERS) \
			--dist loadfile --no-loadscope-reorder --durations=15 solutions tests; \
	fi

# On a machine with a CUDA GPU: the tests marked `cuda`, every solution notebook at the
# full preset under nbval, the benchmarks and the GPU figures (CUDA-event step time, fp16
# + GradScaler parity, pinned copy bandwidth, NCCL start-up, datasheet MFU), in one report
# (results/gpu-check/report.md). PART=tests|labs|benchmarks|figures runs one part (each
# item has a 540 s limit); LABS="03 05" some labs. Without a GPU it says so and exits 0.
PART ?= all
gpu-check: setup
	$(PY) benchmarks/gpu_check.py --part $(PART) $(if $(LABS),--labs $(LABS))

# The quick loop while changing the library: every test not marked `slow` (the slow ones
# launch ranks, grade notebooks in a sandbox, compile in a fresh process, or otherwise take
# more than ~3 s alone), without the browser tests and the solutions under nbval; same 2
# workers, one OpenMP thread each. `make test` still runs everything. Measured on 2 cores
# shared with other jobs: 86-90 s (pytest 75-78 s, 1,045 tests), against 213 s before
# the slowest tests (> 3 s) were marked slow.
test-fast: setup
	$(VENV)/bin/perflab data --quiet
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(PY) -m pytest -n $(TEST_WORKERS) \
		--dist loadfile -m "not slow" --durations=10 tests --ignore=tests/browser

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

# The package as a student gets it: build the sdist and, from it, the wheel; install the
# wheel (not editable) into a fresh venv, torch pinned to this venv's version so pip never
# picks a build; from outside the checkout run --version, doctor, data (the checkout's
# data/ via PERFLAB_DATA), a tiny run and a 2-rank DDP run. Leaves nothing behind.
# Installed with --no-compile, so each module is compiled when first imported; bytecode
# writing is allowed in here (some machines set PYTHONDONTWRITEBYTECODE) so that happens
# once, not in each of the smoke's dozen processes (each would recompile torch: +2.4 s).
wheel-smoke: setup
	@set -eu; start=$$(date +%s); \
	step() { echo "== $$1 ($$(( $$(date +%s) - start )) s)"; }; \
	dir=$$(mktemp -d "$${TMPDIR:-/tmp}/perflab-wheel-smoke.XXXXXX"); \
	trap 'rm -rf "$$dir"' EXIT; \
	torch=$$($(PY) -c "import torch; print(torch.__version__)"); \
	step "wheel smoke in $$dir, torch==$$torch"; \
	$(PY) -m build --outdir "$$dir/dist" . > "$$dir/build.log" 2>&1 \
		|| { tail -30 "$$dir/build.log"; exit 1; }; \
	step "built $$(cd "$$dir/dist" && echo *)"; \
	$(PYTHON) -m venv "$$dir/venv"; \
	"$$dir/venv/bin/python" -m pip install --no-compile "torch==$$torch" \
		"$$dir"/dist/perflab-*.whl > "$$dir/pip.log" 2>&1 || { tail -30 "$$dir/pip.log"; exit 1; }; \
	step "installed into a fresh venv"; \
	cd "$$dir"; \
	unset PYTHONDONTWRITEBYTECODE; \
	export PERFLAB_DATA="$(CURDIR)/data" PERFLAB_RESULTS="$$dir/results"; \
	venv/bin/python -c "import perflab, sys; f = perflab.__file__; \
		sys.exit(0 if f.startswith('$$dir/venv/') else f'perflab imported from {f}')"; \
	if venv/bin/python -c "import nbgrader" 2>/dev/null; then \
		echo "nbgrader is installed without [course]"; exit 1; fi; \
	venv/bin/python -m pip check; \
	venv/bin/perflab --version; \
	venv/bin/python -m perflab --version; \
	venv/bin/perflab doctor; \
	venv/bin/perflab data --quiet; \
	step "doctor and data"; \
	venv/bin/perflab run --preset tiny --model tiny --quiet; \
	step "perflab run"; \
	venv/bin/python -m perflab.distributed --preset tiny --model tiny --world-size 2 --quiet; \
	step "python -m perflab.distributed, 2 ranks"; \
	venv/bin/perflab kernel install --prefix "$$dir/jupyter"; \
	test -f "$$dir/jupyter/share/jupyter/kernels/perflab/kernel.json"; \
	step "wheel smoke passed"

# The student release as a student gets it: `perflab course release` into a scratch
# folder, then its one set-up command (`python3 install.py`) into a fresh virtual
# environment, timed; then checks that torch imports at the tested version (when the
# machine had none), no nvidia-* (CUDA) package was installed on a machine without an
# NVIDIA GPU, perflab imports from the release, the dataset and the Jupyter kernel are
# there, Triton imports on Linux (Lab 11), and `perflab doctor` runs. CI runs it beside the
# wheel smoke.
release-smoke: setup
	@set -eu; dir=$$(mktemp -d "$${TMPDIR:-/tmp}/perflab-release-smoke.XXXXXX"); \
	trap 'rm -rf "$$dir"' EXIT; \
	$(VENV)/bin/perflab course release "$$dir/release" > "$$dir/release.log" 2>&1 \
		|| { tail -30 "$$dir/release.log"; exit 1; }; \
	had_torch=$$($(PYTHON) -c "import torch; print(torch.__version__)" 2>/dev/null || true); \
	cd "$$dir/release"; \
	export JUPYTER_DATA_DIR="$$dir/jupyter" PERFLAB_DATA="$$dir/data" PERFLAB_RESULTS="$$dir/results"; \
	start=$$(date +%s); \
	$(PYTHON) install.py; \
	took=$$(( $$(date +%s) - start )); \
	.venv/bin/python -c "import sys, torch, perflab, importlib.metadata as m; \
		f = perflab.__file__; sys.exit(0 if f.startswith('$$dir/release/') else f'perflab imported from {f}')"; \
	[ -n "$$had_torch" ] || .venv/bin/python -c "import torch, sys; \
		sys.exit(0 if torch.__version__.split('+')[0] == '$(TORCH_TESTED)' \
		else f'torch {torch.__version__}, not the tested $(TORCH_TESTED)')"; \
	cuda=$$(.venv/bin/python -m pip list --format=freeze 2>/dev/null | grep -i '^nvidia' || true); \
	if [ -n "$$cuda" ] && ! [ -d /proc/driver/nvidia/gpus ]; then \
		echo "CUDA packages installed on a machine without an NVIDIA GPU:"; echo "$$cuda"; exit 1; fi; \
	test -f "$$dir/jupyter/kernels/perflab/kernel.json"; \
	test -n "$$(ls "$$dir/data")"; \
	if [ "$$(uname -s)" = Linux ]; then .venv/bin/python -c "import triton" \
		|| { echo "install.py did not install Triton (Lab 11) on Linux"; exit 1; }; fi; \
	.venv/bin/perflab doctor > "$$dir/doctor.log" 2>&1 || { tail -30 "$$dir/doctor.log"; exit 1; }; \
	echo "== release smoke passed: python3 install.py took $$took s"

clean:
	rm -rf $(VENV) results data/photo-patches test-output
