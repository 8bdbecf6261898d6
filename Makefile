# Set-up and entry points of tff_personal. Every target does the set-up it needs.
#   make test   install everything into .venv and run the test suite
#   make demo   install, then FedAvg, FedPer, Ditto and Local on a non-IID
#               Fashion-MNIST split: one table and one PNG (output/demo/)
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
UV_VERSION := 0.13.9
FMNIST_DIR := /usr/share/datasets/fashion-mnist
PYTEST_ARGS ?=
DEMO_FLAGS := configs/demo_fmnist.flags

.PHONY: setup test demo debian-packages clean

setup: $(VENV)/.installed debian-packages

$(VENV)/.installed: requirements.txt overrides.txt requirements-nodeps.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	# Bytecode compiled once here: where PYTHONDONTWRITEBYTECODE is set, every
	# process would otherwise compile TensorFlow's sources again (8 s of each start).
	$(UV) pip install --quiet --python $(PY) --compile-bytecode -r requirements.txt --override overrides.txt
	$(UV) pip install --quiet --python $(PY) --compile-bytecode --no-deps -r requirements-nodeps.txt
	$(UV) pip install --quiet --python $(PY) --no-deps -e .
	touch $@

# Debian packages: dataset-fashion-mnist (the fmnist task's idx files) and
# bazel-bootstrap (`bazel query` of the BUILD files, tests/build_test.py).
# Installed when run as root; otherwise the README says how to get them.
DEBIAN_PACKAGES := $(if $(wildcard $(FMNIST_DIR)/train-images-idx3-ubyte.gz),,dataset-fashion-mnist) \
                   $(if $(shell command -v bazel),,bazel-bootstrap)
debian-packages:
	@if [ -z "$(strip $(DEBIAN_PACKAGES))" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "apt-get install $(strip $(DEBIAN_PACKAGES))"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(DEBIAN_PACKAGES) >/dev/null \
	  || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(DEBIAN_PACKAGES) >/dev/null; } \
	  || echo "warning: could not install $(strip $(DEBIAN_PACKAGES)) (see README)"; \
	else echo "note: missing Debian packages $(strip $(DEBIAN_PACKAGES)) (see README)"; fi

test: setup
	$(PY) -m pytest -n 2 tests $(PYTEST_ARGS)

demo: setup
	$(PY) bin/demo.py --flagfile=$(DEMO_FLAGS)

clean:
	rm -rf $(VENV)
