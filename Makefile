# The targets CI runs are exactly these: `make test` (lint, types, Dockerfile lint, unit,
# integration and deployment tests).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
# `make test` runs the suite in two worker processes, each test file whole in one (its
# module fixtures started once): most of the suite waits on brokers and Redis rather than
# the CPU. `make test PYTEST_PARALLEL=` runs it in one process.
PYTEST_PARALLEL ?= -n 2 --dist loadfile
# apt-get's -q keeps a line per package fetched and set up: the progress of a first install.
APT_INSTALL := DEBIAN_FRONTEND=noninteractive apt-get install -y -q
# Each step says what it does before it does it: a first `make run` takes minutes (apt, PyPI,
# Maven Central), and a silent one reads as a hang.
STEP := @printf '==> %s\n'

.PHONY: setup system-packages run docs test lint unit integration deploy bench chaos soak mutate clean

PROMTOOL := $(BIN)/promtool

setup: system-packages $(STAMP) $(PROMTOOL)

# Redis (and redis-cli, which forms the tests' local Redis Cluster), Java with Maven for the
# local Apache Kafka broker (its jars come from Maven Central), kcat, the third-party client
# the end-to-end test speaks to it with, chromium for the admin page's test (driven by
# Playwright from PyPI; never `playwright install`), and Go for the Go sending example.
system-packages:
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v redis-cli >/dev/null || missing="$$missing redis-tools"; \
	command -v java >/dev/null || missing="$$missing default-jre-headless"; \
	command -v mvn >/dev/null || missing="$$missing maven"; \
	command -v kcat >/dev/null || missing="$$missing kcat"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v go >/dev/null || [ -x /usr/local/go/bin/go ] || missing="$$missing golang-go"; \
	if [ -z "$$missing" ]; then \
		printf '==> %s\n' "system packages: Redis, Java, Maven, kcat, Chromium and Go are here"; \
	else \
		printf '==> %s\n' "system packages: installing$$missing with apt-get (minutes, once)"; \
		apt-get update -qq && $(APT_INSTALL) $$missing; \
	fi

# pip prints a line per package: the progress of the longest step (about 2 minutes on a fresh
# clone, PySpark's build the most of it). setuptools' note on every editable install (a
# folder named as the package may shadow it) says nothing for this layout: it is left out.
$(STAMP): pyproject.toml
	$(STEP) "Python: $(VENV) with blackbox and its development tools from PyPI (about 2 minutes the first time)"
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { apt-get update -qq && $(APT_INSTALL) python3-venv && rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); }
	@$(BIN)/pip install -q --upgrade pip
	@PYTHONWARNINGS='ignore:Editable installation' $(BIN)/pip install -e '.[dev]'
	@touch $(STAMP)
	$(STEP) "Python: $(VENV) is ready"

# promtool checks and unit-tests the alert rules. Debian ships it only inside the prometheus
# package, whose install would also start a Prometheus server: take the one binary from it.
$(PROMTOOL): | $(STAMP)
	$(STEP) "promtool (checks the alert rules): taken from Debian's prometheus package"
	@rm -rf $(VENV)/.promtool && mkdir -p $(VENV)/.promtool
	@cd $(VENV)/.promtool && { apt-get download -qq prometheus 2>/dev/null \
		|| { apt-get update -qq && apt-get download -qq prometheus; }; }
	@dpkg-deb --fsys-tarfile $(VENV)/.promtool/prometheus_*.deb | tar -xO ./usr/bin/promtool > $@.part
	@chmod +x $@.part && mv $@.part $@ && rm -rf $(VENV)/.promtool

# The local stack `make run` starts: its ports, and where Redis's and Kafka's data live
# (inside the clone; `make clean` removes them). Kafka's jars are cached apart, in
# ~/.cache/blackbox, shared by every clone. `make run REDIS_PORT=6380 KAFKA_PORT=9093`
# runs a second stack beside the first.
REDIS_PORT ?= 6379
KAFKA_PORT ?= 9092
DEV_STATE ?= .dev

run: setup
	$(STEP) "blackbox dev: Redis, Apache Kafka (its jars from Maven Central the first time), then the service; Ctrl-C stops all"
	@$(BIN)/blackbox dev --redis-port $(REDIS_PORT) --kafka-port $(KAFKA_PORT) --state-dir $(DEV_STATE)

# The documentation site on http://127.0.0.1:8000, rebuilt on every change (its reference
# pages are generated from the code). `make test` builds it with --strict (tests/deploy).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/hadolint Dockerfile

unit: setup
	$(BIN)/pytest tests/unit

integration: setup
	$(BIN)/pytest tests/integration

deploy: setup
	$(BIN)/pytest tests/deploy

test: lint
	$(BIN)/pytest $(PYTEST_PARALLEL) --durations=25

bench: setup
	$(BIN)/python -m benchmarks.lateness
	$(BIN)/python -m benchmarks.scenarios
	$(BIN)/python -m benchmarks.scaleout
	$(BIN)/python -m benchmarks.series

chaos: setup
	$(BIN)/python -m benchmarks.chaos $(CHAOS)

soak: setup
	$(BIN)/python -m benchmarks.soak

# How much of the pure logic (envelope, schedule, policy, settings) the unit tests pin: mutmut
# changes the code one mutant at a time and counts the mutants no unit test notices
# (configured in pyproject.toml). Not part of `make test`: it takes about 25 min on 2 cores.
mutate: setup
	$(BIN)/pip install -q -e '.[dev,mutation]'
	rm -rf mutants
	$(BIN)/mutmut run --max-children 2 > /dev/null
	$(BIN)/mutmut export-cicd-stats
	@$(BIN)/python -c 'import json; s = json.load(open("mutants/mutmut-cicd-stats.json")); \
		print("mutants %(total)d, killed %(killed)d, survived %(survived)d," % s, \
		      "score %.1f %%" % (100 * s["killed"] / s["total"]))'
	@echo "list the survivors: $(BIN)/mutmut results"

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis mutants $(DEV_STATE)
