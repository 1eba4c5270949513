# Two commands do everything on a fresh machine (Python 3.11, no GPU, no conda):
#   make lab    JupyterLab on 127.0.0.1 (token auth) at notebooks/01_quickstart.ipynb
#   make test   the whole test suite (what CI runs)
# Both create .venv on first use and reinstall when pyproject.toml changes.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The CPU venv's exact versions; pyproject.toml has lower bounds only (a GPU host keeps its torch).
CONSTRAINTS := constraints/cpu.txt
# SGLang's tree kernels: the wheel without its dependencies (it pins another torch
# and many CUDA wheels); its light imports are the [sglang-kernels] extra.
SGLANG := sglang==0.5.23
# dflash.model imports only torch and transformers; its metadata pins tqdm, requests and datasets exactly.
DFLASH := dflash==0.1.0
EXTRAS := notebook,serve,sglang-kernels,test
# Jupyter refuses to run as root without this flag (containers, CI machines).
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

.PHONY: lab test install install-sglang browser train train-hybrid bench clean

lab: $(STAMP)
	$(BIN)/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.open_browser=True $(ROOT_FLAG) notebooks/01_quickstart.ipynb

test: $(STAMP)
	$(BIN)/python -m pytest

install: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch is pinned to 2.13.0 in $(CONSTRAINTS): on a CPU machine pip takes the local CPU wheel, never CUDA.
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) -e ".[$(EXTRAS)]"
	$(BIN)/python -m pip install --quiet --no-deps $(DFLASH)
	$(MAKE) install-sglang
	-$(MAKE) browser
	touch $(STAMP)

install-sglang:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --no-deps $(SGLANG)

# Debian's Chromium for the browser test (Playwright drives it; browsers cannot be downloaded here).
browser:
	@if command -v chromium >/dev/null 2>&1; then echo "chromium: $$(command -v chromium)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  (apt-get install -y -qq chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)); \
	else echo "chromium not installed (needs root and apt-get); the browser test will skip"; fi

# The shipped pairs: dense (about 47 minutes on 2 idle cores; workbench/assets/training_report.json)
# and hybrid, a Qwen3.5-text target (workbench/assets/hybrid/training_report.json).
train: $(STAMP)
	$(BIN)/python -m workbench.train.pipeline --out workbench/assets
	$(BIN)/python -m workbench.train.pipeline --arch hybrid --out workbench/assets/hybrid

train-hybrid: $(STAMP)
	$(BIN)/python -m workbench.train.pipeline --arch hybrid --out workbench/assets/hybrid

bench: $(STAMP)
	$(BIN)/python -m workbench bench --policies ar,dflash,ddtree:16,ddtree:32,ddtree:64

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
