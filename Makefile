# Two entry points (see README): `make demo` runs the main job, `make test` runs the tests.
# Both set everything up first, from nothing, into .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_TESTED := 2.13.0
SUBMISSIONS ?= submissions

.PHONY: setup demo test labs check-labs check-solutions test-browser grade wheel-smoke clean

setup: $(VENV)/.perflab-installed

# --system-site-packages keeps a torch the user already has (e.g. their own CUDA build);
# the tested torch is installed only when none imports. A student needs only
# `pip install .`; this adds the course tooling, the test tools and the browser tests.
# The kernel 'perflab' ("Python (perflab)") lets VS Code or another Jupyter use .venv.
$(VENV)/.perflab-installed: pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "torch==$(TORCH_TESTED)"
	$(PY) -m pip install -e ".[dev,course,browser]"
	$(VENV)/bin/perflab kernel install
	touch $@

demo: setup
	$(VENV)/bin/perflab doctor
	$(VENV)/bin/perflab data
	$(VENV)/bin/perflab run --preset quick

# Unit tests, labs/ drift and grading in TEST_WORKERS pytest-xdist processes (a whole file
# each), one OpenMP thread each, with every lab in a real browser alongside (skipped
# without chromium; its log printed when it ends); then every solution under nbval, alone,
# because the labs' measurements use every core (prints the wall time per notebook). All
# parts always run; make fails if any failed. TEST_WORKERS=0 runs them one after another
# in this process, with torch's default threads. Measured on CI's 2 cores: serially the
# unit part keeps about one core busy (598 s wall for 585 CPU-s); 2 workers with torch's
# default threads oversubscribe the cores (574 s wall, 796 CPU-s: OpenMP threads spin
# waiting for each other); 2 workers with one thread each took 464 s (582 CPU-s). Two
# sandboxed gradings at once claim different slot uids (perflab.course.sandbox).
TEST_WORKERS ?= 2
test: setup
	$(VENV)/bin/perflab data --quiet
	@rc=0; \
	if [ "$(TEST_WORKERS)" = 0 ]; then \
		echo "== unit, grading and course tests, then the labs in the browser"; \
		$(PY) -m pytest --durations=10 tests || rc=$$?; \
	else \
		export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1; \
		log=$$(mktemp "$${TMPDIR:-/tmp}/perflab-browser-tests.XXXXXX"); \
		( $(PY) -m pytest --durations=10 tests/browser > "$$log" 2>&1; \
		  echo $$? > "$$log.rc" ) & \
		echo "== unit, grading and course tests ($(TEST_WORKERS) xdist workers); the browser too"; \
		$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=10 tests \
			--ignore=tests/browser || rc=$$?; \
		wait; \
		echo "== the labs in the browser (ran alongside)"; cat "$$log"; \
		[ "$$(cat "$$log.rc")" = 0 ] || rc=1; rm -f "$$log" "$$log.rc"; \
		unset OMP_NUM_THREADS MKL_NUM_THREADS; \
	fi; \
	echo "== the labs under nbval (alone)"; \
	$(PY) -m pytest --durations=10 solutions || rc=$$?; \
	exit $$rc

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

clean:
	rm -rf $(VENV) results data/photo-patches test-output
