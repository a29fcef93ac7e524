# make run   install what is missing, build, run the main job
# make test  the same set-up, then the whole test suite
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV      ?= .venv
PY        := $(VENV)/bin/python
BUILD     := build
OBJDIR    := src/meridian/bpfobj
BPF_SRC   := $(wildcard bpf/*.bpf.c)
BPF_HDR   := $(wildcard bpf/*.h)
BPF_OBJ   := $(patsubst bpf/%.bpf.c,$(OBJDIR)/%.bpf.o,$(BPF_SRC))
ARCH      := $(shell uname -m | sed -e 's/x86_64/x86/' -e 's/aarch64/arm64/')
CLANG     ?= clang
BPFTOOL   ?= bpftool
# Each test that would otherwise skip needs its package here (MERIDIAN_REQUIRE_BPF=1 fails
# a skip): gcc, libc6-dev and binutils (nm) build test programs, util-linux has setpriv,
# taskset and losetup, mount mounts tracefs and securityfs; kubectl renders deploy/kubernetes
# (kustomize): it comes with this machine's image, else Debian's older kubernetes-client;
# golang-github-containers-common has the default seccomp profile the shipped one is
# checked against.
DEB_PKGS  := clang llvm libbpf-dev bpftool bpftrace fio e2fsprogs util-linux mount zstd gcc \
             libc6-dev binutils strace systemd prometheus iperf3 iproute2 clickhouse-server chromium \
             golang-github-containers-common \
             $(if $(shell command -v kubectl),,kubernetes-client)
PYTEST_ARGS ?=
# The kernel matrix (make test-kernels): Debian 12's own kernel and its backport, booted
# under QEMU by virtme-ng over this root file system; the newest installed of each.
KERNEL_PKGS := qemu-system-x86 busybox-static linux-image-amd64 linux-image-6.12-amd64
KERNELS   ?= $$(for v in 6.1.0 6.12.; do ls -v /boot/vmlinuz-$$v* | tail -n 1; done)
# The OCI image (make image, deploy/image/build.sh): mmdebstrap makes the root file
# system, podman holds the image; runc runs it where crun cannot (a host with hybrid
# cgroups, tests/deploy/test_image.py).
IMAGE_PKGS := mmdebstrap podman runc
# make deploy-test: libfuse 3 for its slow disk (a loop device over a FUSE file that
# sleeps, tests/deploy/slowdisk.py).
DEPLOY_PKGS := libfuse3-3
VERSION   := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE     ?= localhost/meridian:$(VERSION)
IMAGE_SRC := $(shell find src/meridian -name __pycache__ -prune -o -type f \( -name '*.py' -o -name '*.sql' -o -name py.typed \) -print)

.PHONY: help deps venv bpf run test test-kernels wheel image deploy-test lint bench clean
help:
	@echo "make run    set up (Debian packages, venv, BPF objects) and run meridian io for 10 s"
	@echo "make test   the same set-up, then the whole test suite"
	@echo "make test-kernels   the kernel tests again on Debian's 6.1 and 6.12 kernels (QEMU guests)"
	@echo "make wheel  $(BUILD)/dist/meridian_ebpf-$(VERSION)-py3-none-any.whl with the BPF objects (a host's pip install)"
	@echo "make image  the OCI image $(IMAGE) in podman's store (Debian 12, no registry needed)"
	@echo "make deploy-test   the rollout of deploy/ run here: the image's pods, ClickHouse, Prometheus"
	@echo "make lint   ruff and mypy"
	@echo "make bench  every benchmark in benchmarks/ (tables to copy into benchmarks/RESULTS.md)"

# Debian packages: install only what is missing (apt-get update once, first); checked
# again whenever this Makefile (the lists) changes.
define install_missing
	@mkdir -p $(BUILD)
	@missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "error: missing Debian packages: $$missing (run as root, or apt-get install them)" >&2; exit 2; fi; \
	  echo "installing: $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	@touch $@
endef

deps: $(BUILD)/.deps
$(BUILD)/.deps: Makefile
	$(call install_missing,$(DEB_PKGS))

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml | $(BUILD)/.deps
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[all,dev]'
	@touch $@

# vmlinux.h comes from this kernel's BTF; it is build output, never committed.
$(BUILD)/vmlinux.h: | $(BUILD)/.deps
	@test -r /sys/kernel/btf/vmlinux || { echo "error: this kernel has no BTF at /sys/kernel/btf/vmlinux (needs CONFIG_DEBUG_INFO_BTF=y)" >&2; exit 2; }
	@command -v $(BPFTOOL) >/dev/null || { echo "error: bpftool not found (apt-get install bpftool)" >&2; exit 2; }
	$(BPFTOOL) btf dump file /sys/kernel/btf/vmlinux format c > $@.tmp && mv $@.tmp $@

$(OBJDIR)/%.bpf.o: bpf/%.bpf.c $(BPF_HDR) $(BUILD)/vmlinux.h
	@command -v $(CLANG) >/dev/null || { echo "error: clang not found (apt-get install clang llvm)" >&2; exit 2; }
	@mkdir -p $(OBJDIR)
	$(CLANG) -g -O2 -Wall -Werror -target bpf -mcpu=v3 -D__TARGET_ARCH_$(ARCH) \
	  -I$(BUILD) -Ibpf -c $< -o $@.tmp
	llvm-strip -g $@.tmp && mv $@.tmp $@

bpf: $(BPF_OBJ)

run: venv bpf
	$(VENV)/bin/meridian io --workload --duration 10 --format text

# The suite in two runs: the tests that load no BPF program four at a time (pytest-xdist,
# a file to a worker: its module fixtures start once; many of them wait on a server or a
# subprocess, so 4 workers beat 2 on 2 CPUs), then the kernel tests alone, whose timings
# are the machine's. Both run even when the first fails; a run that selects no test
# (exit 5, a PYTEST_ARGS of one kind only) is no failure.
test: venv bpf
	@rc=0; \
	$(PY) -m pytest -n 4 --dist loadfile -m "not kernel and not deploy" $(PYTEST_ARGS) || \
	  { r=$$?; [ $$r -eq 5 ] || rc=$$r; }; \
	$(PY) -m pytest -m "kernel and not deploy" $(PYTEST_ARGS) || { r=$$?; [ $$r -eq 5 ] || rc=$$r; }; \
	exit $$rc

$(BUILD)/.kernel-deps: Makefile | $(BUILD)/.deps
	$(call install_missing,$(KERNEL_PKGS))

test-kernels: venv bpf $(BUILD)/.kernel-deps
	$(PY) -m pip install -q -e '.[kernels]'
	$(PY) tests/kernel_matrix.py $(KERNELS)

# deploy/wheel.sh refuses a wheel without every BPF object (exit 2).
wheel: venv bpf
	deploy/wheel.sh $(PY) $(BUILD)/dist

$(BUILD)/.image-deps: Makefile | $(BUILD)/.deps
	$(call install_missing,$(IMAGE_PKGS))

# Rebuilt when the script, pyproject.toml, the sources or the BPF objects change, or
# when the image is no longer in podman's store (podman rmi).
image: venv bpf $(BUILD)/.image-deps
	@podman image exists $(IMAGE) || rm -f $(BUILD)/image/.built
	@$(MAKE) --no-print-directory $(BUILD)/image/.built

$(BUILD)/image/.built: deploy/image/build.sh deploy/wheel.sh pyproject.toml $(IMAGE_SRC) $(BPF_OBJ)
	deploy/image/build.sh $(PY) $(BUILD)/image $(IMAGE)
	@touch $@

# The fleet rollout of deploy/, run on this machine (tests/deploy, marker `deploy`, which
# `make test` leaves out): the image, each DaemonSet's pod template under podman kube
# play as written, Debian's ClickHouse and Prometheus.
$(BUILD)/.deploy-deps: Makefile | $(BUILD)/.image-deps
	$(call install_missing,$(DEPLOY_PKGS))

deploy-test: image $(BUILD)/.deploy-deps
	$(PY) -m pytest -m deploy tests/deploy $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

bench: venv bpf
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) benchmarks/run.py

# Mutation testing (mutmut 3; not in CI: long; docs/testing.md keeps the score, the
# survivors and why mutmut). It runs in $(BUILD)/mutation, a copy of src and tests,
# never on the work tree. MUTATE: the code mutated (globs); MUTATION_TESTS: the
# non-kernel tests that may kill its mutants (mutmut runs, for each mutant, those
# that cover its function). Each module's selection is in docs/testing.md, e.g.
# make mutation MUTATE=src/meridian/hist.py MUTATION_TESTS="tests/test_hist.py ...".
MUTATE ?= src/meridian/tools/sentinel/storage/*
MUTATION_TESTS ?= tests/test_sentinel_storage_sender.py tests/test_sentinel_storage_spool.py \
                  tests/test_sentinel_storage_rows.py
.PHONY: mutation
mutation: venv bpf
	$(PY) -m pip install -q 'mutmut>=3.8,<4'
	rm -rf $(BUILD)/mutation && mkdir -p $(BUILD)/mutation
	cp -r src tests pyproject.toml $(BUILD)/mutation/
	printf '%s\n' '[mutmut]' 'source_paths = src' 'only_mutate =' $(foreach m,$(MUTATE),'    $(m)') \
	  'pytest_add_cli_args =' '    -m' '    not kernel' '    -p' '    no:cacheprovider' \
	  'pytest_add_cli_args_test_selection =' $(foreach t,$(MUTATION_TESTS),'    $(t)') \
	  > $(BUILD)/mutation/setup.cfg
	cd $(BUILD)/mutation && nice -n 19 $(abspath $(VENV))/bin/mutmut run --max-children 2
	cd $(BUILD)/mutation && $(abspath $(VENV))/bin/mutmut results

clean:
	rm -rf $(BUILD) $(OBJDIR)
