# Nodeflow: every set-up step lives here so that `make run` and `make test` work on a
# fresh machine that has only Python (3.11, 3.12 or 3.13: `make run PYTHON=python3.13` picks one)
# and make.
SHELL := /bin/bash
PYTHON ?= python3
UV_VERSION := 0.13.9
TOOLS := .tools
UV := $(TOOLS)/bin/uv
VENV := .venv
PY := $(VENV)/bin/python
NODES ?= 16
# Empty: the simulator's default shape, which grows with NODES.
TOPOLOGY ?=
# sim: the simulator's Kubernetes API emulator. real: a real control plane on loopback
# (tools/kube/real_kube.sh: needs Go; the first build takes about 35 minutes, then is cached).
KUBE ?= sim

IMAGE ?= ghcr.io/nodeflow/nodeflow:0.1.0

.PHONY: image venv tools run stop test test-thorough mutate test-real-slurm test-real-kube lint typecheck proto proto-check bench clean

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet "uv==$(UV_VERSION)"

# The lock file pins every package; --frozen refuses to install anything it does not name.
$(VENV)/.synced: $(UV) pyproject.toml uv.lock
	UV_PYTHON=$(PYTHON) $(UV) sync --frozen --quiet
	touch $@

venv: $(VENV)/.synced

run: venv
	$(PY) -m nodeflow_runtime.launcher --nodes $(NODES) --topology "$(TOPOLOGY)" --kube $(KUBE)

stop:
	$(PY) -m nodeflow_runtime.launcher --stop

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: venv
	$(VENV)/bin/mypy

proto: venv
	$(PY) -m nodeflow_contracts.proto_gen proto

proto-check: venv
	$(PY) -m nodeflow_contracts.proto_gen --check proto

# kubectl drives the emulator in the conformance tests; Debian's kubernetes-client provides it
# where the machine has none and we are root (as CI is). Otherwise the kubectl tests skip, or
# fail under CI=true. helm (for the chart tests) is built from its Go module, cached by version
# in /var/tmp/nodeflow-helm, and linked into .tools/bin where the tests look for it; without Go
# the chart tests skip (fail under CI=true). promtool (for the alert rule tests) is built and
# cached (/var/tmp/nodeflow-promtool) the same way.
tools: $(TOOLS)/bin/helm $(TOOLS)/bin/promtool
	@command -v kubectl >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && apt-get install -y -qq kubernetes-client; \
	  else echo "kubectl not found: the kubectl conformance tests will not run"; fi; }

# Rebuilt only when the script (and with it the pinned version) changes.
$(TOOLS)/bin/helm: tools/helm/build_helm.sh
	@mkdir -p $(TOOLS)/bin
	@if command -v go >/dev/null || [ "$$CI" = "true" ]; then \
	  helm="$$(tools/helm/build_helm.sh)" && ln -sf "$$helm" $@ && $@ version --short; \
	else echo "go not found: helm is not built and the Helm chart tests will not run"; fi

$(TOOLS)/bin/promtool: tools/prometheus/build_promtool.sh
	@mkdir -p $(TOOLS)/bin
	@if command -v go >/dev/null || [ "$$CI" = "true" ]; then \
	  promtool="$$(tools/prometheus/build_promtool.sh)" && ln -sf "$$promtool" $@ && $@ --version | head -1; \
	else echo "go not found: promtool is not built and the alert rule tests will not run"; fi

test: venv tools
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) -m nodeflow_contracts.proto_gen --check proto
	$(VENV)/bin/pytest -q -p no:cacheprovider
	@if [ "$$CI" = "true" ]; then $(MAKE) --no-print-directory test-real-slurm; fi
	@if [ "$$CI" = "true" ]; then $(MAKE) --no-print-directory test-real-kube; fi

# The Slurm conformance suite (once per API version the slurmrestd serves and we speak),
# slurm-syncer's real-Slurm tests and the NodeSet safe deletion (whole stack) against a real Slurm
# (slurmctld, four slurmd, slurmrestd with JWT) in a debootstrapped Debian root on loopback, for
# each Debian suite of SLURM_SUITES in turn: trixie is Slurm 24.11 (v0.0.40-v0.0.42), forky 26.05
# (v0.0.42-v0.0.45). Each suite's root is cached in /var/tmp/nodeflow-slurm/<suite>. Needs root;
# CI runs it. `make test-real-slurm SLURM_SUITES=trixie` tests one release only.
SLURM_SUITES ?= trixie forky
test-real-slurm: venv
	@mkdir -p .run
	@status=0; for suite in $(SLURM_SUITES); do \
	  if tools/slurm/real_slurm.sh start $$suite > .run/real-slurm-$$suite.env; then \
	    ( set -a && . ./.run/real-slurm-$$suite.env && set +a && \
	      echo "test-real-slurm: Debian $$suite, Slurm $$NODEFLOW_SLURM_RELEASE, slurmrestd" \
	        "serves $$NODEFLOW_SLURM_API_VERSIONS; slurm-syncer uses $$($(PY) -c \
	        'import os; from nodeflow_contracts.slurm_api import choose_version as c; \
	        print(c(os.environ["NODEFLOW_SLURM_API_VERSIONS"].split(",")).name)')," \
	        "the conformance suite each of ours served" && \
	      $(VENV)/bin/pytest -v -p no:cacheprovider tests/conformance/slurm \
	        tests/integration/slurm_syncer/test_real_slurm.py \
	        tests/integration/nodeset_controller/test_real_slurm.py ) || status=1; \
	  else echo "test-real-slurm: the $$suite Slurm did not start"; status=1; fi; \
	  tools/slurm/real_slurm.sh stop $$suite; \
	done; exit $$status

# The Kubernetes conformance suite against a real control plane on loopback: etcd 3.6,
# kube-apiserver, kube-controller-manager and kube-scheduler v1.36 and KWOK, built from their Go
# modules (needs Go 1.26 and the Go module proxy) and cached in /var/tmp/nodeflow-kube, so only
# the first build on a machine is slow. The suite gets what the emulator's conformance fixture
# is: the API server with its controllers, no scheduler, no CRD installed yet, and only the two
# KWOK nodes its tests bind pods to (KWOK keeps them Ready and leaves the pods alone). Then the
# scheduler, our CRDs, KWOK's pod stages and the simulator's 16 GPU nodes join for tests/realkube
# (deploy artifacts and the Helm chart's render by server dry run, k8s-watcher as its
# ServiceAccount, the Slurm bridge, the whole stack, make run KUBE=real).
test-real-kube: venv tools
	@mkdir -p .run
	export KUBE_STATE=$(CURDIR)/.run/real-kube KUBE_NODES=0 KUBE_SCHEDULER=0 KUBE_CRDS=0 \
	  KUBE_POD_STAGES=0 && \
	  { { tools/kube/real_kube.sh start > .run/real-kube.env && \
	      tools/kube/real_kube.sh named-nodes node-a node-b; } || \
	    { tools/kube/real_kube.sh stop; exit 1; }; } && \
	  set -a && . ./.run/real-kube.env && set +a && \
	  status=0; NODEFLOW_CONFORMANCE_KUBECONFIG=$$NODEFLOW_KUBE_KUBECONFIG \
	    $(VENV)/bin/pytest -q -p no:cacheprovider tests/conformance/k8s || status=$$?; \
	  { tools/kube/real_kube.sh scheduler && tools/kube/real_kube.sh crds && \
	    tools/kube/real_kube.sh kwok-pods && tools/kube/real_kube.sh nodes 16 && \
	    $(VENV)/bin/pytest -q -p no:cacheprovider tests/realkube; } || status=1; \
	  tools/kube/real_kube.sh stop; exit $$status

bench: venv
	$(PY) -m bench $(BENCH)

# The unit tests' property tests with ten times the examples, random (HYPOTHESIS_PROFILE in
# tests/conftest.py; docs/testing.md). Not part of `make test`.
test-thorough: venv
	HYPOTHESIS_PROFILE=thorough $(VENV)/bin/pytest -q -p no:cacheprovider tests/unit $(TESTS)

# Mutation testing of the pure decision cores (tools/mutate; docs/testing.md): killed/total per
# module and every surviving mutant. Long: `make mutate MODULES=services/topology_placer/fit.py`
# runs one module. Not part of `make test`.
mutate: venv
	$(PY) -m tools.mutate $(MODULES)

# Build the runtime image (no simulator) and push it to the registry IMAGE names:
# `make image IMAGE=registry.example.com/nodeflow:0.1.0`. With docker buildx, one multi-arch
# image for PLATFORMS (the builder must reach both: QEMU binfmt or a node per architecture, e.g.
# `docker buildx create --use`); with podman, a manifest list of PLATFORMS (QEMU binfmt for the
# foreign one); with only a docker that has no buildx, this machine's architecture, said so.
PLATFORMS ?= linux/amd64,linux/arm64
image:
	@if command -v docker >/dev/null && docker buildx version >/dev/null 2>&1; then \
	  echo "docker buildx: $(IMAGE) for $(PLATFORMS)"; \
	  docker buildx build --platform "$(PLATFORMS)" --target runtime -t "$(IMAGE)" --push .; \
	elif command -v podman >/dev/null; then \
	  echo "podman: $(IMAGE) for $(PLATFORMS), as a manifest list"; \
	  podman manifest rm "$(IMAGE)" >/dev/null 2>&1 || true; \
	  podman build --platform "$(PLATFORMS)" --target runtime --manifest "$(IMAGE)" . && \
	    podman manifest push --all "$(IMAGE)" "docker://$(IMAGE)"; \
	elif command -v docker >/dev/null; then \
	  echo "docker buildx not found: building $(IMAGE) for this machine's architecture only" \
	    "($$(uname -m)), not $(PLATFORMS); install the buildx plugin for a multi-arch image"; \
	  docker build --target runtime -t "$(IMAGE)" . && docker push "$(IMAGE)"; \
	else echo "neither docker nor podman found"; exit 1; fi

clean:
	rm -rf $(VENV) $(TOOLS) .run .mypy_cache .ruff_cache .pytest_cache
