# Ray Train on EKS with EFA — developer entry points. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= cdk.out
ENV ?= dev
BASE ?= HEAD
# A second virtualenv with the image's own Python and packages (config/image.toml, requirements-image.lock).
IMAGE_VENV ?= .venv-image
IPY := $(IMAGE_VENV)/bin/python
# jsii (under aws-cdk-lib) prints a large banner on Node 20; the CDK CLI itself is pinned in package.json.
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20

.PHONY: help setup setup-cdk synth test test-suite test-fast test-image iac-scan wheels lint format typecheck diff review ls lock lock-image imports train-local train-local-data clean

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-17s %s\n", $$1, $$2}'

# Two markers: .installed-cdk (the CDK side: what synthesis, diff and deploy import) and .installed
# (everything: plus torch/Ray/transformers and the test tools). Synthesis imports nothing from the
# train or dev groups, so `make synth` needs only the first, whichever of setup-cdk or setup made it.
# A full install made before this marker existed counts (same time stamp, so it stays current).
$(VENV)/.installed-cdk: pyproject.toml requirements.lock package.json package-lock.json
	@if [ -f $(VENV)/.installed ] && [ -z "$$(find $^ -newer $(VENV)/.installed)" ]; then \
	  touch -r $(VENV)/.installed $@; \
	else \
	  set -e; \
	  $(PYTHON) -m venv $(VENV); \
	  $(PY) -m pip install --quiet --upgrade 'pip>=25.1'; \
	  $(PY) -m pip install --quiet -c requirements.lock -e .; \
	  npm ci --no-audit --no-fund --loglevel=error; \
	  touch $@; \
	fi

$(VENV)/.installed: $(VENV)/.installed-cdk
	$(PY) -m pip install --quiet -c requirements.lock -e . --group dev --group train
	touch $@

setup: $(VENV)/.installed ## create .venv (CDK + training + test tools) and node_modules (CDK CLI, cdk8s-cli)

setup-cdk: $(VENV)/.installed-cdk ## CDK side only (no torch/ray): enough for synth, ls, diff, review, deploy and raytrain

# `make synth` synthesizes every environment; `make synth ENV=prod` only that one. Only an ENV given
# on make's command line counts (sh reads an ENV variable of its own from the environment).
SYNTH_ENVS := $(if $(filter command line,$(origin ENV)),$(ENV))

synth: setup-cdk ## synthesize every environment (or ENV=NAME) offline into cdk.out/<env>/, print a summary
	$(PY) -m stacks.synth_all$(if $(SYNTH_ENVS), $(SYNTH_ENVS)) --out $(OUT)

ls: setup-cdk ## list the stacks of ENV (default dev) through the CDK CLI
	npx cdk ls -c env=$(ENV) -o $(OUT)/$(ENV)

diff: setup-cdk ## npx cdk diff for ENV against the deployed stacks (needs AWS credentials; offline: make review)
	@$(PY) -c "import boto3, sys; sys.exit(0 if boto3.session.Session().get_credentials() else 1)" || { \
	  echo "make diff compares with the deployed stacks: it needs AWS credentials for env=$(ENV)'s account." >&2; \
	  echo "  aws sso login --profile NAME && export AWS_PROFILE=NAME" >&2; \
	  echo "  (or export AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN)" >&2; \
	  echo "Offline, against a git ref or a saved cdk.out: make review ENV=$(ENV) [BASE=...]" >&2; \
	  exit 1; }
	npx cdk diff -c env=$(ENV) -o $(OUT)/$(ENV)

review: setup-cdk ## offline review of ENV against BASE (git ref, default HEAD, or a saved cdk.out/<env>); exit 1 if a critical resource would be replaced
	$(VENV)/bin/raytrain review --env $(ENV) --base $(BASE)

# PYTEST_ARGS: extra pytest arguments. CI passes -m "not image": it runs the training package's tests
# (tests/training, Ray Train and Ray Data end to end included) once, in test-image, on the versions the
# Ray pods run, instead of once here and again there. Without it, `make test` runs every test.
PYTEST_ARGS ?=
# Lint and the type check (one core, ~2 min from a cold cache) run beside the tests (the other core).
test: setup ## lint, type-check and run the whole test suite
	$(MAKE) --no-print-directory -j2 lint typecheck test-suite

test-suite: setup ## the test suite alone (with PYTEST_ARGS), no lint or type check
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: setup ## tests without the slow Ray integration tests
	$(PY) -m pytest -m "not ray"

# The image's Python is found on PATH, through pyenv or uv (never by a path of this machine).
$(IMAGE_VENV)/.installed: requirements-image.lock config/image.toml | $(VENV)/.installed
	rm -rf $(IMAGE_VENV)
	PYTHON_IMAGE="$$($(PY) -m config.image find-python)" && \
	  $(VENV)/bin/uv venv --quiet --python "$$PYTHON_IMAGE" $(IMAGE_VENV)
	$(PY) -m config.image image-requirements > $(IMAGE_VENV)/requirements.txt
	$(VENV)/bin/uv pip sync --quiet --python $(IPY) --require-hashes $(IMAGE_VENV)/requirements.txt
	touch $@

# Ray's dashboard gives each of its modules 30 s to start; on a busy 2-core CI machine that is not enough.
test-image: export RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT := 300
# tests/training but the few that need a package the image lacks (marker dev_packages, run by
# `make test`): CI runs these here only (see PYTEST_ARGS).
test-image: $(IMAGE_VENV)/.installed ## tests/training and a short training run on the image's Python and package versions
	$(IPY) -m config.image check
	$(IPY) -m pytest tests/training -m image -p no:cacheprovider
	rm -rf runs/image-smoke
	HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled $(IPY) -m training --init random --shape tiny \
	  --data training/data/sample/sample.jsonl --num-workers 2 --micro-batch-size 2 --global-batch-size 8 \
	  --steps 4 --checkpoint-every 2 --run-name image-smoke --output-dir runs/image-smoke
	$(IPY) -c "import json, sys; s = json.load(open('runs/image-smoke/summary.json')); \
	  sys.exit(0 if s['steps'] == 4 else 'smoke run: %s steps, expected 4' % s['steps'])"

# checkov, isolated from .venv (it pins packaging<24, which ray needs newer): uvx runs it in its own venv.
CHECKOV_VERSION := 3.3.30
iac-scan: synth ## checkov over every synthesized CloudFormation template (suppressions live in resource metadata)
	$(VENV)/bin/uvx --from checkov==$(CHECKOV_VERSION) checkov -d $(OUT) --framework cloudformation \
	  --skip-download --compact --quiet

lint: setup ## ruff lint and format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup ## apply ruff formatting and fixes
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck: setup ## mypy over the packages
	$(VENV)/bin/mypy

LOCAL_TRAIN = HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled $(PY) -m training --init random --shape tiny \
	  --num-workers 2 --micro-batch-size 2 --global-batch-size 8 --steps 30 --checkpoint-every 10 --lr 1e-3

train-local: setup ## train the tiny preset on random token ids, 2 CPU workers (~1 min); results in runs/local
	rm -rf runs/local
	$(LOCAL_TRAIN) --data random --run-name local --output-dir runs/local

train-local-data: setup ## the same on the bundled text: prepare token shards (Ray Data), then train from them
	rm -rf runs/local-data
	HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled $(PY) -m training.prepare --data training/data/sample \
	  --out runs/local-data/prepared --shape tiny --seq-len 256
	$(LOCAL_TRAIN) --data runs/local-data/prepared --run-name local-data --output-dir runs/local-data

lock: ## re-resolve requirements.lock from pyproject.toml in a scratch venv
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet --upgrade 'pip>=25.1'
	.lock-venv/bin/pip install --quiet -e . --group dev --group train
	{ sed -n '1,3p' requirements.lock; .lock-venv/bin/pip freeze --exclude-editable | sed 's/+cpu$$//'; } > requirements.lock.new
	mv requirements.lock.new requirements.lock && rm -rf .lock-venv

wheels: setup ## fetch the job's wheels (config/image.toml [job_packages]) into wheels/, hash-checked against requirements-image.lock
	$(PY) -m stacks.code_asset

lock-image: setup ## re-resolve requirements-image.lock (the image's versions, config/image.toml) with uv
	$(PY) -m config.image lock

imports: setup ## regenerate k8s/imports from the KubeRay CRDs in k8s/crds (one module per CRD)
	rm -rf k8s/imports/raycluster k8s/imports/rayjob
	npx cdk8s import raycluster:=k8s/crds/ray.io_rayclusters.yaml -l python -o k8s/imports --no-check-upgrade
	npx cdk8s import rayjob:=k8s/crds/ray.io_rayjobs.yaml -l python -o k8s/imports --no-check-upgrade

clean: ## remove synthesized output and caches
	rm -rf $(OUT) .pytest_cache .mypy_cache .ruff_cache runs $(IMAGE_VENV)
