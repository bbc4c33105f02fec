# The two set-up commands of the README. Both create .venv if it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-jax bench api clean

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test,bench,flower,jax]"
	touch $(STAMP)

demo: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=3 $(PY) -m keras_fedpriv demo

# Two test passes, side by side:
# - TensorFlow (the default backend): every test, on parallel workers (pytest-xdist; each holds
#   its own TensorFlow, up to 3 GB): 4 by default, twice a 2-core machine's cores, because
#   the tests that start Flower processes mostly wait on Flower's polling (its fixed 1-3 s
#   sleeps) while other workers compute (with 3, a fresh clone's run used 1.3 of its 2 cores).
#   Tests that run Flower's Simulation Engine (Ray) run one after another on one worker, and the
#   tests of a module stay on one worker (tests/conftest.py). TEST_WORKERS=auto: one per core;
#   TEST_WORKERS=0: this process only.
# - JAX (KERAS_BACKEND=jax): the backend-neutral test modules (marked `jax`) again, on
#   one process (JAX_WORKERS=0; a fresh clone's run with JAX_WORKERS=2 took a minute longer,
#   20m15s: the machine's 2 cores were already busy) at a lower priority (nice 5: with nice 10 it
#   ended 45-50 s after the TensorFlow pass, alone on one core), filling the CPU time the
#   TensorFlow pass leaves while its Flower tests wait. Its output goes to $(JAX_LOG),
#   printed after the TensorFlow pass.
#   It runs the core of them (tests/conftest.py JAX_CORE: the backend, the mechanisms, the
#   layers, the adversarial tests of their inputs, restores and ledger, a step of each
#   protocol), to save CI time;
#   JAX_PASS=0 skips it; `make test-jax` runs every `jax` module, in the foreground.
# `make test` fails if either pass fails.
TEST_WORKERS ?= 4
JAX_WORKERS ?= 0
JAX_PASS ?= 1
JAX_LOG := build/test-jax.log
PYTEST_TF := TF_CPP_MIN_LOG_LEVEL=3 $(PY) -m pytest -q -n $(TEST_WORKERS) \
	--dist loadgroup --durations 15 tests
PYTEST_JAX := env KERAS_BACKEND=jax TF_CPP_MIN_LOG_LEVEL=3 $(PY) -m pytest -q -n 0 -m jax \
	-p no:cacheprovider --durations 15 tests
test: $(STAMP)
	@if [ "$(JAX_PASS)" = 0 ]; then $(PYTEST_TF); exit $$?; fi; \
	mkdir -p $(dir $(JAX_LOG)); \
	KERAS_FEDPRIV_JAX_TESTS=core nice -n 5 $(PYTEST_JAX) -n $(JAX_WORKERS) --dist loadgroup \
		>$(JAX_LOG) 2>&1 & jax=$$!; \
	$(PYTEST_TF); tf=$$?; \
	wait $$jax; status=$$?; \
	echo; echo "==== JAX pass (KERAS_BACKEND=jax, tests marked jax): $(JAX_LOG)"; \
	cat $(JAX_LOG); \
	echo "==== TensorFlow pass: exit $$tf; JAX pass: exit $$status"; \
	[ $$tf = 0 ] && [ $$status = 0 ]

test-jax: $(STAMP)
	$(PYTEST_JAX)

# The API reference needs this checkout's package and pdoc 16 only: it creates .venv (with the
# package's dependencies, no extras) only if it is missing, always installs this checkout
# editable without dependencies (cheap; so the reference documents this code, not another
# installed version), installs pdoc (the version the `test` extra pins) unless pdoc 16 is
# there, and never upgrades pip.
PDOC := pdoc>=16,<17
api:
	test -x $(PY) || ($(PYTHON) -m venv $(VENV) && $(PY) -m pip install --quiet -e .)
	$(PY) -m pip install --quiet --no-deps -e .
	$(PY) -c "import pdoc, sys; sys.exit(pdoc.__version__.split('.')[0] != '16')" 2>/dev/null \
		|| $(PY) -m pip install --quiet "$(PDOC)"
	$(PY) docs/build_api.py build/api

bench: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=3 $(PY) bench/rr_with_prior.py
	TF_CPP_MIN_LOG_LEVEL=3 $(PY) bench/layer_overhead.py
	TF_CPP_MIN_LOG_LEVEL=3 $(PY) bench/vertical_privacy.py
	TF_CPP_MIN_LOG_LEVEL=3 $(PY) bench/vertical_k.py
	TF_CPP_MIN_LOG_LEVEL=3 $(PY) bench/hfl_throughput.py
	TF_CPP_MIN_LOG_LEVEL=3 $(PY) bench/hfl_signds.py
	TF_CPP_MIN_LOG_LEVEL=3 $(PY) bench/laplace_eval.py
	TF_CPP_MIN_LOG_LEVEL=3 $(PY) bench/audit.py
	TF_CPP_MIN_LOG_LEVEL=3 $(PY) bench/gradient_inversion.py
	TF_CPP_MIN_LOG_LEVEL=3 $(PY) bench/budget.py
	TF_CPP_MIN_LOG_LEVEL=3 $(PY) bench/learnability.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
