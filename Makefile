# Snapshot: the two commands a newcomer needs are `make demo` and `make test`;
# both run `make setup` first (idempotent: system packages, then the virtualenv).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup system venv tools images test demo clean-node cluster cluster-smoke bench bench-shim bench-oci bench-webhook bench-shm bench-follow kind-smoke conformance lint fmt generate clean

setup: system venv tools

# crictl, critest, Kubernetes' binaries, helm, kind and its etcd: test tools built from their Go
# modules into a cache outside the repo (a second run finds them)
tools:
	@bash tools/build-cri-tools.sh
	@bash tools/build-kube-tools.sh
	@bash tools/build-kind-tools.sh
	@bash tools/install-containerd2.sh

system:
	@bash scripts/setup-system.sh

venv: $(STAMP)

$(STAMP): pyproject.toml scripts/link-pycriu.sh
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,gpu,demo,control]'
	bash scripts/link-pycriu.sh $(VENV)
	touch $(STAMP)

# the two images the cluster story and `make cluster` run (their base layers are cached outside
# the repo, keyed by what goes in): built before any cluster starts, so the first run on a
# machine is the same as every later one
images: setup
	@SNAPSHOT_PYTHON=$(PY) bash tools/build-image.sh snapshot >/dev/null
	@SNAPSHOT_PYTHON=$(PY) bash tools/build-image.sh cpu-demo >/dev/null

# lint first: a ruff error fails the tests (and CI) as any failing test does
test: setup images
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest

# what a killed demo, test run or `make cluster` left on this machine (containerd and its
# shims, the kubelet and the control plane, their mounts, network namespaces, veths, bridges,
# iptables chains, registries, /tmp/snapshot-*); only devnode's, never the host's services
clean-node: venv
	$(PY) -m devnode.sweep

demo: setup
	$(PY) -m examples.cpu_demo.run

# a real one-node cluster on this machine (kube-apiserver, controller-manager, scheduler,
# kube-proxy, containerd 2.x, kubelet) with the chart installed from images built here;
# prints the kubeconfig and the demo image, stops everything on Ctrl-C
cluster: setup images
	$(PY) -m devnode.cluster

# the README's Kubernetes walkthrough on that cluster, through helm and kubectl only (~5 min):
# a table, then one JSON object as the last line
cluster-smoke: setup images
	SNAPSHOT_WRITE_RESULTS=1 $(PY) -m pytest -q -p no:cacheprovider tests/test_cluster_story.py
	$(PY) -m devnode.smoke_report

# cold start vs checkpoint vs restore on this machine (CPU, through containerd + the shim),
# then the table and chart of every result in bench/results (the GPU ones are committed:
# bench/gpu/proof.py on an H200). ~8 min.
bench: setup
	$(PY) -m bench.cpu
	$(PY) -m bench.report

# kind, for real: a private Docker daemon, a kind node image built here with nothing pulled
# (cached after the first run), the chart and the CPU example's story, and the host left as
# it was; the figures go to bench/results/kind-smoke.json. `make test` runs it too.
kind-smoke: setup images
	SNAPSHOT_WRITE_RESULTS=1 $(PY) -m pytest -q -p no:cacheprovider tests/test_kind_smoke.py
	@cat bench/results/kind-smoke.json

# the shim's memory and start latency against containerd's runc shim
bench-shim: setup
	$(PY) -m bench.shim_overhead

# the webhook under load: restore-pod reviews over TLS at concurrency 16, with PodSnapshot
# lookups in a real kube-apiserver (requests/s, p50/p99, errors)
# restore from the OCI store (cold and warm node cache) vs the node's volume. ~3 min.
bench-oci: setup
	$(PY) -m bench.oci_store

bench-webhook: setup
	$(PY) -m bench.webhook_load

# restoring shared memory (pinned host buffers' kind): the memory file against CRIU alone
bench-shm: setup
	$(PY) -m bench.shared_memory

# a checkpoint with its page images hashed during the dump and after it, alternated (~1 min)
bench-follow: setup
	$(PY) -m bench.checkpoint_follow

# CRI conformance (critest) under runc and under snapshot, on containerd 1.7 and 2.x; ~35 min,
# so not part of make test.
# Results: bench/results/conformance.json
conformance: setup
	$(PY) -m bench.conformance

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# regenerate the shim's protobuf modules; CI fails if they drift from the .proto files
generate: venv
	PY=$(PY) bash scripts/generate-protos.sh
	git diff --exit-code shim/proto

fmt: venv
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
