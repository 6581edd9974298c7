# hoptrace: `make demo` runs the main job, `make test` the tests. Both install what they need.
SHELL := /bin/bash
ROOT := $(abspath .)
TOOLS := $(ROOT)/.tools/bin
VENV := $(ROOT)/.venv
PY := $(VENV)/bin/python
export PATH := $(TOOLS):$(VENV)/bin:/usr/local/go/bin:$(PATH)
export GOBIN := $(TOOLS)

BPF_BUILD := kernel-patch/build
BPF_OBJ := $(BPF_BUILD)/hoptrace.bpf.o
VMLINUX_H := $(BPF_BUILD)/vmlinux.h
AGENT_BIN := agent/bin/hoptrace-agent
INFLUXD := $(TOOLS)/influxd

APT_PACKAGES := clang llvm libbpf-dev bpftool iproute2 sockperf iperf3 tcpdump nftables clang-format \
	ethtool chromium chromium-driver bpftrace qemu-system-x86 kmod busybox-static openvswitch-switch \
	docker.io docker-compose debootstrap containerd runc containernetworking-plugins conmon tshark

PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2

.PHONY: help
help: ## this list
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

## ---- setup -------------------------------------------------------------
.PHONY: setup
setup: .tools/apt.stamp $(VENV)/.stamp $(INFLUXD) web/node_modules/.package-lock.json .tools/compose-venv/bin/docker-compose \
	vm-kernels kafka ## install everything the build, demo and tests need

# The kernel matrix's guests (lab/vm.py): Debian's 5.10, 6.1 and 6.12, fetched into a private apt state.
KERNEL_SUITES := bullseye bookworm bookworm-backports

.PHONY: vm-kernels
vm-kernels: .tools/kernels/.stamp ## fetch the Debian kernels the kernel matrix boots (about 30 s, once)

.tools/kernels/.stamp: lab/kernels.sh
	bash lab/kernels.sh .tools/kernels $(KERNEL_SUITES)
	@touch $@

.tools/apt.stamp: Makefile
	@mkdir -p .tools
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing: $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	@touch $@

$(VENV)/.stamp: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	@touch $@

web/node_modules/.package-lock.json: web/package.json web/package-lock.json
	npm ci --prefix web --no-audit --no-fund

# docker-compose (PyPI v1) validates deploy/docker-compose.yml in tests/deploy; it pins PyYAML 5.4.1, hence
# its own venv (and Cython < 3 to build that PyYAML).
.tools/compose-venv/bin/docker-compose:
	python3 -m venv .tools/compose-venv
	.tools/compose-venv/bin/pip install -q "cython<3" wheel "setuptools<70"
	.tools/compose-venv/bin/pip install -q --no-build-isolation PyYAML==5.4.1
	.tools/compose-venv/bin/pip install -q docker-compose==1.29.2

# Apache Kafka (KRaft) for the Kafka tests (lab/kafka.py): the broker's jars and their dependencies from
# Maven Central, as lab/kafka/pom.xml lists them; Java 17 runs them.
KAFKA_STAMP := .tools/kafka/libs/.stamp

.PHONY: kafka
kafka: $(KAFKA_STAMP) ## fetch Apache Kafka 4.4 (KRaft broker) jars from Maven Central into .tools/kafka (once)

$(KAFKA_STAMP): lab/kafka/pom.xml
	@command -v mvn >/dev/null && command -v java >/dev/null || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven openjdk-17-jre-headless; }
	rm -rf .tools/kafka/libs
	mvn -q -B -f lab/kafka/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
		-DoutputDirectory=$(ROOT)/.tools/kafka/libs
	@touch $@

$(INFLUXD):
	@mkdir -p $(TOOLS)
	@echo "building influxd v1.8.10 from the Go module proxy (about 2 minutes, once)"
	cd /tmp && go install github.com/influxdata/influxdb/cmd/influxd@v1.8.10

$(TOOLS)/protoc-gen-go:
	go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

$(TOOLS)/protoc-gen-go-grpc:
	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

## ---- build -------------------------------------------------------------
.PHONY: build
build: bpf agent pyc ## build the BPF object and the agent, byte-compile the Python

# hoptrace's Python byte-compiled here, once per change: a checkout shared read-only (a guest's, lab/vm.py)
# cannot write its own __pycache__, and compiling every module at each start takes minutes under TCG.
PY_PACKAGES := cli collector common dispatcher lab results spec web proto/gen/python
PYC_STAMP := $(VENV)/.pyc-stamp

.PHONY: pyc
pyc: $(PYC_STAMP) ## byte-compile hoptrace's Python (a read-only checkout runs from these caches)

$(PYC_STAMP): $(shell find $(PY_PACKAGES) -name '*.py' -not -path '*/node_modules/*' 2>/dev/null) | $(VENV)/.stamp
	$(PY) -m compileall -q -x node_modules $(PY_PACKAGES)
	@touch $@

$(VMLINUX_H):
	@mkdir -p $(BPF_BUILD)
	bpftool btf dump file /sys/kernel/btf/vmlinux format c > $@

.PHONY: bpf
bpf: .tools/apt.stamp ## compile the CO-RE hop programs (kernel-patch/)

# hoptrace.bpf.o (hop programs) and the preset objects of hoptrace mace / hoptrace iron.
BPF_OBJS := $(BPF_OBJ) $(BPF_BUILD)/mace.bpf.o $(BPF_BUILD)/iron.bpf.o $(BPF_BUILD)/hook.bpf.o
bpf: $(BPF_OBJS)

$(BPF_BUILD)/%.bpf.o: kernel-patch/%.bpf.c $(wildcard kernel-patch/include/*.h) $(VMLINUX_H)
	clang -O2 -g -Wall -Werror -target bpf -D__TARGET_ARCH_x86 \
		-I$(BPF_BUILD) -Ikernel-patch/include -c $< -o $@

.PHONY: agent
agent: $(AGENT_BIN) ## build hoptrace-agent (static Go binary)

$(AGENT_BIN): $(shell find agent -name '*.go' -o -name go.mod -o -name go.sum 2>/dev/null)
	cd agent && CGO_ENABLED=0 go build -trimpath -o bin/hoptrace-agent ./cmd/hoptrace-agent

# The mirrors of kernel-patch/include/hoptrace.h (record layout, flags, wire constants, counters) for Go,
# Python and the proto's enum Counter, generated from the object's BTF.
VOCAB_OUT := agent/internal/record/record_gen.go agent/internal/loader/programs_gen.go \
	agent/internal/allowlist/policy_gen.go proto/gen/python/hoptrace/kernel_abi.py proto/hoptrace/v1/counters.proto

.PHONY: vocab
vocab: $(BPF_OBJS) ## regenerate the mirrors of hoptrace.h and the agent's allowlist from the objects
	cd agent && go run ./cmd/vocabgen -object ../$(BPF_OBJ) -go internal/record/record_gen.go \
		-go-programs internal/loader/programs_gen.go \
		-allowlist internal/allowlist/policy_gen.go \
		-allowlist-objects hops=../$(BPF_OBJ),mace=../$(BPF_BUILD)/mace.bpf.o,iron=../$(BPF_BUILD)/iron.bpf.o,hook=../$(BPF_BUILD)/hook.bpf.o \
		-python ../proto/gen/python/hoptrace/kernel_abi.py -proto ../proto/hoptrace/v1/counters.proto

.PHONY: proto
proto: vocab $(VENV)/.stamp $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc ## regenerate Go and Python code from proto/
	bash proto/generate.sh

.PHONY: proto-check
proto-check: proto ## fail if the generated code in git is stale
	@git diff --exit-code -- agent/internal/pb proto/gen $(VOCAB_OUT) || \
		{ echo "generated code is stale: run 'make proto' and commit"; exit 1; }

## ---- checks ------------------------------------------------------------
# import-linter reads packages from the file system, but hoptrace's parts are mapped into one package by
# pyproject's package-dir: rebuild that layout as symlinks for it to read.
IMPORT_TREE := .tools/import-tree
define IMPORT_TREE_PY
import os, pathlib, tomllib
dirs = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
tree = pathlib.Path("$(IMPORT_TREE)")
for package, source in sorted(dirs.items()):
    target = tree.joinpath(*package.split("."))
    if package == "hoptrace":
        target.mkdir(parents=True)
        for entry in pathlib.Path(source).iterdir():
            if f"hoptrace.{entry.name}" not in dirs:  # mapped packages are linked below
                os.symlink(entry.resolve(), target / entry.name)
    elif not target.exists():
        os.symlink(pathlib.Path(source).resolve(), target)
endef
export IMPORT_TREE_PY

.PHONY: lint-imports
lint-imports: $(VENV)/.stamp ## the layering of the parts (import-linter contracts in pyproject.toml)
	@rm -rf $(IMPORT_TREE) && $(PY) -c "$$IMPORT_TREE_PY"
	PYTHONPATH=$(ROOT)/$(IMPORT_TREE) $(VENV)/bin/lint-imports

.PHONY: lint
lint: $(VENV)/.stamp lint-imports ## ruff, import layering, gofmt, go vet, clang-format
	$(VENV)/bin/ruff check dispatcher collector results spec web cli common lab tests bench
	$(VENV)/bin/ruff format --check dispatcher collector results spec web cli common lab tests bench
	@test -z "$$(gofmt -l agent)" || { gofmt -l agent; exit 1; }
	cd agent && go vet ./...
	clang-format --dry-run -Werror kernel-patch/*.c kernel-patch/include/*.h

# The unit tier runs as nobody to prove it needs no root. The venv's interpreter lives under /root (pyenv),
# so Debian's python3.11 (same ABI) runs it with the venv's site-packages, and only those (-S): Debian's
# dist-packages may hold older copies (docker.io -> runc -> criu brings python3-protobuf 3.21).
UNIT_HOME := /tmp/hoptrace-unit-home
.PHONY: test-unit
test-unit: setup ## the pure tests (marker unit), as an unprivileged user
	@mkdir -p $(UNIT_HOME) && chmod 1777 $(UNIT_HOME)
	setpriv --reuid=65534 --regid=65534 --clear-groups env HOME=$(UNIT_HOME) PYTHONDONTWRITEBYTECODE=1 \
		/usr/bin/python3.11 -S -c "import site, sys; site.addsitedir('$(VENV)/lib/python3.11/site-packages'); \
		import pytest; sys.exit(pytest.main(['-q', '-m', 'unit', '-p', 'no:cacheprovider', 'tests']))"

# The root tiers (tests/conftest.py gives each test its tiers; docs/testing.md says what each needs and
# takes). Each test is in exactly one of test-unit and these (tests/test_tiers.py checks it).
PYTEST := $(PY) -m pytest -v --durations=25
TIER_ROOT := root and not (vm or browser or docker or kafka or k8s)
TIER_VM := vm
TIER_BROWSER := browser and not vm
TIER_DOCKER := docker and not (vm or browser)
TIER_KAFKA := kafka and not (vm or browser or docker)

.PHONY: test-root
test-root: setup build helm jaeger ## namespaces, BPF on this kernel, InfluxDB: every root test but the four tiers below
	$(PYTEST) -m '$(TIER_ROOT)' tests

.PHONY: test-vm
test-vm: setup build ## qemu guests of Debian's 5.10, 6.1, 6.12: the kernel matrix, the demo, guests as hosts
	$(PYTEST) -m '$(TIER_VM)' tests

.PHONY: test-browser
test-browser: setup build ## the web UI in headless Chromium, on a traced cluster
	$(PYTEST) -m '$(TIER_BROWSER)' tests

.PHONY: test-docker
test-docker: setup build ## the Docker engine: the compose stack (deploy/local), containers traced by name
	$(PYTEST) -s -m '$(TIER_DOCKER)' tests

.PHONY: test-kafka
test-kafka: setup build ## the collector's Kafka transport against a real broker (KRaft)
	$(PYTEST) -m '$(TIER_KAFKA)' tests

.PHONY: test
# proto-check before build: it rewrites the generated Go files, which would leave the agent older than them
# (and a guest's `make demo` would build it again, minutes under TCG).
test: setup proto-check build helm jaeger lint test-unit ## run every test tier (needs root)
	cd agent && go test -race -count=1 ./...
	@# the _floor variants (kernels 5.10-5.17), proven here on a fast kernel too
	cd agent && HOPTRACE_FLOOR=1 go test -count=1 ./internal/loader ./internal/tracer
	$(PYTEST) tests --ignore=tests/deploy/test_compose.py --ignore=tests/k8s
	$(MAKE) --no-print-directory compose-test
	$(MAKE) --no-print-directory test-k8s
	$(MAKE) --no-print-directory fuzz FUZZ_TIME=50000x FUZZ_EXAMPLES=1000
	$(PY) bench/run.py --quick

## ---- compose stack (deploy/local) ----------------------------------------
# Docker engine (started if none runs, inside 198.18.0.0/15, no iptables), images from one local Debian
# base and the artifacts built above; state in .tools/compose. hoptrace.lab.compose has the details.
.PHONY: compose-base
compose-base: setup ## the Debian base image hoptrace/debian:bookworm (debootstrap + docker import, ~1 min once)
	$(PY) -m hoptrace.lab.compose base

.PHONY: compose-images
compose-images: setup build ## every image of deploy/local/docker-compose.yml (~1 min; nothing when unchanged)
	$(PY) -m hoptrace.lab.compose images

.PHONY: compose-kafka-image
compose-kafka-image: kafka ## the Kafka override's broker image hoptrace/kafka:local (Debian's Java 17 + the jars; ~40 s once)
	$(PY) -m hoptrace.lab.compose kafka-image

.PHONY: compose-test
compose-test: setup build ## the compose stack up, two containers traced via CLI and web UI, all down (~40 s)
	$(PY) -m pytest -v -s tests/deploy/test_compose.py

# Go native fuzzing (the record decoder; the BPF parser through BPF_PROG_TEST_RUN) and Hypothesis over
# the spec loader. make test runs them briefly.
FUZZ_TIME ?= 5m
FUZZ_EXAMPLES ?= 20000
FUZZ_TARGETS := internal/record:FuzzDecode internal/loader:FuzzRecordingHop internal/loader:FuzzTaggingHop \
	internal/loader:FuzzFastPathAgrees

.PHONY: fuzz
fuzz: setup build ## the fuzzers: FUZZ_TIME per Go target (5m, or 50000x runs), FUZZ_EXAMPLES random specs
	@for target in $(FUZZ_TARGETS); do \
		echo "fuzz $$target for $(FUZZ_TIME)"; \
		(cd agent && go test -run '^$$' -fuzz "^$${target##*:}$$" -fuzztime $(FUZZ_TIME) ./$${target%%:*}) || exit 1; \
	done
	HOPTRACE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q tests/spec/test_spec_hostile.py

.PHONY: bench
bench: setup build jaeger ## every benchmark, full size (~12 min): bench/results/<time>.{json,md,png}
	$(PY) bench/run.py --full

.PHONY: bench-quick
bench-quick: setup build jaeger ## every benchmark at a tiny size, every other bench script once (SMOKE_RUNS); make test runs it
	$(PY) bench/run.py --quick

.PHONY: demo-guest
GUEST_KERNEL ?= 6.1
demo-guest: setup build ## make demo inside a guest of GUEST_KERNEL (5.10, 6.1, 6.12), TCG: 3-5 minutes
	$(PY) -m hoptrace.lab.vm $(GUEST_KERNEL) --demo --log .tools/demo-guest-$(GUEST_KERNEL).log

.PHONY: demo
# Ctrl-C is how `DEMO_ARGS=--keep` ends: the demo cleans up and exits 130, which is no error of make's (the
# recipe's shell ignores SIGINT; the demo sets its own handler).
demo: setup build ## two emulated hosts, a traced UDP flow, the per-hop decomposition
	trap '' INT; $(PY) -m hoptrace.cli.demo $(DEMO_ARGS) || [ $$? -eq 130 ]

.PHONY: clean
clean: ## remove build output
	rm -rf $(BPF_BUILD) agent/bin

## ---- Kubernetes lab cluster (lab/kubernetes.py) ---------------------------
# kube-apiserver, kube-controller-manager, kube-scheduler, the kubelet, kube-proxy, kubectl and etcd built
# from the Go module proxy at the k8s.io/kubernetes version lab/kubernetes/go.mod pins, once per version
# into .tools/k8s/VERSION (docs/kubernetes-lab.md has the build times). containerd, runc and the CNI
# plugins are Debian's (APT_PACKAGES).
K8S_VERSION := $(shell awk '$$1 == "k8s.io/kubernetes" {print $$2}' lab/kubernetes/go.mod)
K8S_TOOLS := .tools/k8s/$(K8S_VERSION)
TIER_K8S := k8s

.PHONY: k8s-tools
k8s-tools: .tools/apt.stamp $(K8S_TOOLS)/kubectl ## build Kubernetes' commands and etcd into .tools/k8s/VERSION (once per version)

# build.sh fills VERSION.partial and renames it: kubectl exists only when every command does.
$(K8S_TOOLS)/kubectl:
	bash lab/kubernetes/build.sh $(K8S_TOOLS)

# helm, built from the Go module proxy (helm.sh/helm/v3 at HELM_VERSION, which lab/kubernetes.py pins) into
# .tools/helm/VERSION, once per version: the chart's tests (deploy/helm) and the k8s tier install with it.
HELM_VERSION := $(shell sed -n 's/^HELM_VERSION = "\([^"]*\)".*/\1/p' lab/kubernetes.py)
HELM := .tools/helm/$(HELM_VERSION)/helm

.PHONY: helm
helm: $(HELM) ## build helm into .tools/helm/VERSION (once per version; about 2 min cold)

$(HELM):
	bash lab/kubernetes/build-helm.sh $(HELM_VERSION) $(@D)

## ---- OpenTelemetry backend (lab/otel.py) ---------------------------------
# Jaeger v2 (an OpenTelemetry Collector distribution with an in-memory trace store and a query API), the
# backend the collector's OTLP export is tested against, built from the Go module proxy at the version
# lab/jaeger/go.mod pins into .tools/jaeger/VERSION, once per version.
JAEGER_VERSION := $(shell awk '$$1 == "github.com/jaegertracing/jaeger" {print $$2}' lab/jaeger/go.mod)
JAEGER := .tools/jaeger/$(JAEGER_VERSION)/jaeger

.PHONY: jaeger
jaeger: $(JAEGER) ## build Jaeger v2 into .tools/jaeger/VERSION (once per version; about 6 min cold)

$(JAEGER):
	bash lab/jaeger/build.sh $(@D)

# CRI-O for the CRI lab (lab/crio.py): crio, pinns and importimage built from the Go module proxy at the
# version lab/crio/go.mod pins, once per version into .tools/crio/VERSION; conmon, runc and the CNI plugins are
# Debian's (APT_PACKAGES).
CRIO_VERSION := $(shell awk '$$1 == "github.com/cri-o/cri-o" {print $$2}' lab/crio/go.mod)
CRIO_TOOLS := .tools/crio/$(CRIO_VERSION)

.PHONY: crio
crio: .tools/apt.stamp $(CRIO_TOOLS)/crio ## build CRI-O (crio, pinns, importimage) into .tools/crio/VERSION (once per version; about 4 min cold)

# build.sh fills VERSION.partial and renames it: crio exists only when every program does.
$(CRIO_TOOLS)/crio:
	bash lab/crio/build.sh $(CRIO_TOOLS)

.PHONY: test-k8s
test-k8s: setup build k8s-tools helm crio ## a one-node Kubernetes cluster: a pod behind a ClusterIP Service; hoptrace installed by helm, tracing pod -> pod; pods named through CRI-O
	$(PYTEST) -m '$(TIER_K8S)' tests
