# kubegpu.node development entry point. `make help` lists the targets.
# Everything a fresh Debian 12 machine needs is installed by `make setup` (apt + a pinned virtual environment).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

ROOT       := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))
VENV       := $(ROOT)/.venv
TMP        := $(ROOT)/.tmp
BIN        := $(VENV)/bin
PYTHON     ?= python3
# The collection is reachable as ansible_collections/kubegpu/node through this link, for ansible, pytest and ansible-test.
COLLECTIONS := $(TMP)/collections
export ANSIBLE_COLLECTIONS_PATH := $(COLLECTIONS)
export ANSIBLE_COLLECTIONS_SCAN_SYS_PATH := true
export PYTHONPATH := $(COLLECTIONS)
export PATH := $(BIN):$(TMP)/bin:$(PATH)
export ANSIBLE_FORCE_COLOR := false
export PY_COLORS := 0
# podman settings this CI machine needs (runc, explicit ulimits), without touching /etc/containers.
export CONTAINERS_CONF := $(ROOT)/tools/containers.conf

# Scenarios left out of `make test` (run them by name: make molecule MOLECULE_SCENARIOS=x); none today.
MOLECULE_OPT_IN :=
MOLECULE_SCENARIOS ?= $(filter-out $(MOLECULE_OPT_IN),$(sort $(notdir $(patsubst %/molecule.yml,%,$(wildcard $(ROOT)/molecule/*/molecule.yml)))))
# sid is not built: its systemd (262) does not boot on these cgroup v1 hosts; containerd 2.x comes from sid onto trixie.
IMAGES ?= bullseye bookworm trixie

.PHONY: help setup system venv link images kubectl lint sanity unit molecule test demo build ee awx clean

help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

setup: system venv link kubectl images ## Everything the demo and the tests need (apt packages, venv, kubectl, images)

system: ## Debian packages: podman with runc, debootstrap
	@$(ROOT)/tools/install-system-packages.sh

venv: $(VENV)/.stamp ## The pinned Python virtual environment in .venv
$(VENV)/.stamp: $(ROOT)/requirements/dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --requirement $(ROOT)/requirements/dev.txt
	touch $@

link: ## Make the collection importable as ansible_collections.kubegpu.node
	@mkdir -p $(COLLECTIONS)/ansible_collections/kubegpu
	@ln -sfn $(ROOT) $(COLLECTIONS)/ansible_collections/kubegpu/node

kubectl: ## Debian's kubectl (a real Kubernetes client) into .tmp/bin
	@$(ROOT)/tools/install-kubectl.sh $(TMP)

images: system ## Debian node images for molecule, built with debootstrap, cached in podman
	@$(ROOT)/tools/build-images.sh $(IMAGES)

lint: venv link ## yamllint, ansible-lint (production profile), ruff, argument specs against defaults
	yamllint --strict .
	ruff check .
	ruff format --check .
	$(BIN)/python $(ROOT)/tools/check_argument_specs.py
	$(BIN)/python $(ROOT)/tools/check_conditions.py
	@# ansible-lint installs the collection it lints into its cache's collections folder, ~/.ansible on a shared machine
	@# (it shadowed every other checkout): with ANSIBLE_HOME here, that folder is .tmp/collections, where the link of
	@# `make link` is this checkout and nothing is installed. Its schemas are the pinned release's (no download).
	ANSIBLE_HOME=$(TMP) ANSIBLE_LINT_SKIP_SCHEMA_UPDATE=1 ansible-lint --profile production --strict

sanity: venv ## ansible-test sanity from a temporary ansible_collections/kubegpu/node copy
	@$(ROOT)/tools/sanity.sh

unit: venv link kubectl ## pytest: unit tests, module tests against the simulated API server, kubectl fidelity
	pytest $(ROOT)/tests -q --durations=25

molecule: venv link images ## Every molecule scenario (check, converge, idempotence, verify) on podman
	@$(ROOT)/tools/run-molecule.sh $(MOLECULE_SCENARIOS)

build: venv ## Build the Galaxy tarball, install it into a temporary path and use it by FQCN
	@$(ROOT)/tools/check-build.sh

# CI reaches no registry: the execution environment is built from the local Debian 12 image (`make images`), not from
# the definition's public base image.
EE_BASE_IMAGE ?= localhost/kubegpu-node-test:bookworm
export EE_BASE_IMAGE

ee: venv images ## The execution environment image (ansible-builder; rebuilt only when its inputs change)
	@$(ROOT)/tools/build-ee.sh

awx: venv link images ## site.yml run as AWX runs a job: in the execution environment, through ansible-runner
	@$(ROOT)/tools/timed.sh ee $(ROOT)/tools/build-ee.sh
	KUBEGPU_AWX_TEST=1 pytest $(ROOT)/tests/awx -q --basetemp=$(TMP)/awx-test

test: setup ## The full test run (what CI runs): static gates, then molecule beside unit, awx and the demo
	@$(ROOT)/tools/run-gates.sh

demo: system ## Run playbooks/site.yml against podman containers standing in for GPU nodes
	@# Only what the demo needs (its nodes run Debian 12), the venv and the image built side by side.
	@$(MAKE) --no-print-directory -j3 venv link kubectl images IMAGES=bookworm
	@$(ROOT)/demo/run.sh

clean: ## Remove the venv, caches and demo containers (images and the kubegpu-ccache volume stay in podman)
	-$(ROOT)/demo/run.sh --clean
	rm -rf $(VENV) $(TMP) .pytest_cache .ruff_cache
