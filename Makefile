# slurmrl — every set-up step lives here, so a fresh Debian/Ubuntu machine needs only
# `make demo` or `make test` (as root).
#
# The site install is a virtual environment in $(VENV), outside /root, because services
# and drivers run as the job's own user and must be able to execute that Python.

# bash: dash (Debian's /bin/sh) runs no EXIT trap when a signal ends it, so a Ctrl-C or
# a CI timeout's SIGTERM left every daemon of the dev cluster running
SHELL     := /bin/bash
VENV      ?= /opt/slurmrl/venv
STATE     ?= /var/lib/slurmrl-dev
PY        := $(VENV)/bin/python
SLURMRL   := $(VENV)/bin/slurmrl
STAMP     := $(VENV)/.requirements-$(shell cat requirements/ci.txt requirements/constraints.txt | sha1sum | cut -c1-12)
# libslurm-dev: spank.h, which the unit tests compile the SPANK plugin against (they run
# before `dev-cluster up` installs the rest of Slurm).
APT_PKGS  := python3 python3-venv python3-dev gcc make libc6-dev libslurm-dev

.PHONY: all deps venv install spank lint typecheck unit sim integration test demo \
        cluster-up cluster-down clean

all: install

deps:
	@missing=""; for p in $(APT_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q ' installed$$' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "make: installing Debian packages:$$missing"; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(STAMP): requirements/ci.txt requirements/constraints.txt | deps
	@test -x $(PY) || /usr/bin/python3 -m venv $(VENV)
	$(PY) -m pip install -q -r requirements/ci.txt -c requirements/constraints.txt
	@rm -f $(VENV)/.requirements-*; touch $@

venv: $(STAMP)

# Not editable on purpose: processes run as other users import the installed copy,
# wherever this checkout lives (CI may clone under a directory they cannot read).
# `build/` goes first: setuptools copies all of build/lib, so a module removed from the
# checkout would stay installed from an earlier build.
install: venv
	@rm -rf build
	$(PY) -m pip install -q --no-deps --no-build-isolation --force-reinstall .

lint: install
	$(VENV)/bin/ruff check .

typecheck: install
	$(VENV)/bin/mypy

unit: install
	$(PY) -m pytest -q tests/unit

sim: install
	$(PY) -m pytest -q tests/sim

cluster-up: install
	$(SLURMRL) dev-cluster up --state-dir $(STATE)

cluster-down:
	@if [ -x $(SLURMRL) ]; then $(SLURMRL) dev-cluster down --state-dir $(STATE); fi

# Integration tests run on the real local Slurm; the daemons are stopped whatever happens:
# pass, fail, Ctrl-C or SIGTERM (`up` and the run each go in the background and are
# waited for, so that the shell takes the signal at once, ends it, and then stops the
# cluster; a foreground command would hold the traps until it returned).
WITH_CLUSTER = set -e; \
	trap '$(SLURMRL) dev-cluster down --state-dir $(STATE) || true' EXIT; \
	trap 'kill -TERM $$child 2>/dev/null || true; wait $$child 2>/dev/null || true; \
	      exit 143' INT TERM; \
	$(SLURMRL) dev-cluster up --state-dir $(STATE) & child=$$!; wait $$child; \
	SLURMRL_DEV_STATE=$(STATE) $(1) & child=$$!; wait $$child

integration: install
	@$(call WITH_CLUSTER,$(PY) -m pytest -q tests/integration)

test: lint typecheck unit sim integration

demo: install
	@$(call WITH_CLUSTER,$(PY) examples/demo.py)

clean:
	rm -rf build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache
