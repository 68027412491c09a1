# Two commands: `make demo` and `make test`. Each creates .venv if missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
OUT ?= out

.PHONY: demo test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e .
	touch $@

# torch==2.13.0 is a CPU build; installing it first keeps the extra's range from pulling a CUDA build.
$(VENV)/.installed-dev: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[dev,torch]"
	touch $@ $(VENV)/.installed

DEMO ?= problems/iclr/1.5b-p8-m24.yaml

demo: $(VENV)/.installed
	mkdir -p $(OUT)
	$(BIN)/zbsolve compare --devices 8 --microbatches 24 --profile $(DEMO)
	$(BIN)/zbsolve solve $(DEMO) --mem-factor 2 --time-limit 30 -o $(OUT)/best.json --chart $(OUT)/best.png
	@echo "schedule written to $(OUT)/best.json, chart to $(OUT)/best.png"

test: $(VENV)/.installed-dev
	$(BIN)/ruff check zbsolve zbsolve_cli
	$(BIN)/mypy zbsolve zbsolve_cli
	$(BIN)/python -m pytest -q -n auto --dist loadgroup

clean:
	rm -rf $(VENV) $(OUT)
