PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test bench lint clean

$(STAMP): pyproject.toml constraints-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints-dev.txt -e '.[dev,examples,viz]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/cdist.py
	$(BIN)/python examples/metric_learning.py

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

lint: $(STAMP)
	$(BIN)/ruff check autograd_groups tests examples benchmarks
	$(BIN)/mypy autograd_groups

clean:
	rm -rf $(VENV) out build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
