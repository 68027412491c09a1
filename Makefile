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

demo: $(VENV)/.installed
	mkdir -p $(OUT)
	$(BIN)/zbsolve compare --stages 8 --microbatches 24
	$(BIN)/zbsolve schedule zb-h1 --stages 8 --microbatches 24 -o $(OUT)/zb-h1.json --chart $(OUT)/zb-h1.png
	@echo "chart written to $(OUT)/zb-h1.png"

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -n auto

clean:
	rm -rf $(VENV) $(OUT)
