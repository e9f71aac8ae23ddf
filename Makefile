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
# One make run at a time installs into $(VENV) or uses the dev cluster: there is one
# cluster per machine (fixed ports), and a run's closing `down` would stop it, and
# cancel every job, under another run's tests. A second run waits (up to LOCK_WAIT s)
# and says so. In /run, not the world-writable /run/lock: root opens it, and there a
# symlink planted by any user would choose the file.
LOCK      ?= /run/slurmrl-dev.lock
LOCK_WAIT ?= 3600

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

# $(TAKE_LOCK) at the start of a recipe's shell: the lock is held on fd 9 until that
# shell exits, whatever ends it (pass, failure, signal). Commands that may leave a
# process behind (the daemons `up` starts, a test run's strays) run with `9>&-`, so
# nothing but the recipe's shell keeps the lock.
TAKE_LOCK = exec 9>>$(LOCK); \
	if ! flock -n 9; then \
	  echo "make: waiting for $(LOCK): another make run is using the dev cluster or $(VENV)" >&2; \
	  flock -w $(LOCK_WAIT) 9 || { echo "make: gave up on $(LOCK) after $(LOCK_WAIT) s" >&2; exit 1; }; \
	fi

$(STAMP): requirements/ci.txt requirements/constraints.txt | deps
	@set -e; $(TAKE_LOCK); \
	if [ -e $@ ]; then exit 0; fi; \
	test -x $(PY) || /usr/bin/python3 -m venv $(VENV); \
	echo "$(PY) -m pip install -q -r requirements/ci.txt -c requirements/constraints.txt"; \
	$(PY) -m pip install -q -r requirements/ci.txt -c requirements/constraints.txt; \
	rm -f $(VENV)/.requirements-*; touch $@

venv: $(STAMP)

# Not editable on purpose: processes run as other users import the installed copy,
# wherever this checkout lives (CI may clone under a directory they cannot read).
# `build/` goes first: setuptools copies all of build/lib, so a module removed from the
# checkout would stay installed from an earlier build.
install: venv
	@set -e; $(TAKE_LOCK); rm -rf build; \
	echo "$(PY) -m pip install -q --no-deps --no-build-isolation --force-reinstall ."; \
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
	@set -e; $(TAKE_LOCK); $(SLURMRL) dev-cluster up --state-dir $(STATE) 9>&-

cluster-down:
	@set -e; if [ -x $(SLURMRL) ]; then \
	  $(TAKE_LOCK); $(SLURMRL) dev-cluster down --state-dir $(STATE) 9>&-; fi

# Integration tests run on the real local Slurm; the daemons are stopped whatever happens:
# pass, fail, Ctrl-C or SIGTERM (`up` and the run each go in the background and are
# waited for, so that the shell takes the signal at once, ends it, and then stops the
# cluster; a foreground command would hold the traps until it returned). All of it holds
# the lock, taken before the traps are set: a run still waiting for it stops nothing.
# The INT/TERM trap first ignores both: make forwards the TERM a CI timeout sends the
# group, and a second TERM inside the trap made dash skip the EXIT trap.
# `up --cancel-jobs` clears the queue of jobs left by a run killed before its `down`
# (under the lock no other run's jobs can be there).
WITH_CLUSTER = set -e; $(TAKE_LOCK); \
	trap '$(SLURMRL) dev-cluster down --state-dir $(STATE) 9>&- || true' EXIT; \
	trap 'trap "" INT TERM; kill -TERM $$child 2>/dev/null || true; \
	      wait $$child 2>/dev/null || true; exit 143' INT TERM; \
	$(SLURMRL) dev-cluster up --cancel-jobs --state-dir $(STATE) 9>&- & child=$$!; \
	wait $$child; \
	SLURMRL_DEV_STATE=$(STATE) $(1) 9>&- & child=$$!; wait $$child

integration: install
	@$(call WITH_CLUSTER,$(PY) -m pytest -q tests/integration)

test: lint typecheck unit sim integration

demo: install
	@$(call WITH_CLUSTER,$(PY) examples/demo.py)

clean:
	rm -rf build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache
