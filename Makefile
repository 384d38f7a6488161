PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-torch bench lint docs dist clean

$(STAMP): pyproject.toml constraints-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints-dev.txt -e '.[viz]' --group dev
	touch $(STAMP)

install: $(STAMP)

# The doctor exits 1 when it finds a problem, which is what the demo shows.
demo: $(STAMP)
	$(BIN)/python examples/cdist.py
	$(BIN)/python examples/metric_learning.py
	$(BIN)/autograd-groups doctor examples/triplet_nan.py -- --steps 3 || test $$? -eq 1

# The docs site is built in the suite too (tests/test_docs_site.py: mkdocs build --strict).
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

docs: $(STAMP)
	$(BIN)/mkdocs build --strict

# The whole suite on another PyTorch release, in a venv of its own (.venv-torch-V). The registry's
# wheels for other releases carry CUDA libraries (about 5 GB); they run on the CPU.
# PIP_CONSTRAINT=/dev/null lifts a machine-wide pip cap on torch for this install only.
V ?=
TORCH_VENV := .venv-torch-$(V)

$(TORCH_VENV)/.installed: pyproject.toml
	@test -n "$(V)" || { echo "make test-torch: name a release, e.g. make test-torch V=2.15.0"; exit 2; }
	$(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/pip install -q --upgrade pip
	echo "torch==$(V)" > $(TORCH_VENV)/constraints.txt
	PIP_CONSTRAINT=/dev/null $(TORCH_VENV)/bin/pip install -q -c $(TORCH_VENV)/constraints.txt -e '.[viz]' --group dev
	touch $@

test-torch: $(TORCH_VENV)/.installed
	$(TORCH_VENV)/bin/python -m pytest -q -n 2 --dist loadgroup

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

lint: $(STAMP)
	$(BIN)/ruff check autograd_groups tests examples benchmarks scripts
	$(BIN)/mypy autograd_groups
	@# pyright exits 1 below 100 %; the gate is 98 % of the exported symbols typed. It finds the
	@# package through PYTHONPATH: an editable install is an import hook it cannot follow.
	PYTHONPATH=$(CURDIR) $(BIN)/pyright --pythonpath $(BIN)/python --verifytypes autograd_groups --ignoreexternal --outputjson | $(BIN)/python -c \
	  'import json, sys; s = json.load(sys.stdin)["typeCompleteness"]["completenessScore"]; \
	  print(f"pyright --verifytypes: {s:.1%} of the exported symbols typed (at least 98% wanted)"); \
	  sys.exit(s < 0.98)'

dist: $(STAMP)
	$(BIN)/python -m build

clean:
	rm -rf $(VENV) .venv-torch-* out build dist site *.egg-info .pytest_cache .mypy_cache .ruff_cache
