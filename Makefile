# Two commands on a fresh machine: `make demo` and `make test`. Both set everything up.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
EXTRAS := dev,torch,nvtx,ray,verl,dashboards,instrument

.PHONY: demo test test-fast lint bench system-deps

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[$(EXTRAS)]'
	touch $@

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

test: $(STAMP) system-deps
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
