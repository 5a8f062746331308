# Tarantella: the two commands of the README, and the steps they are made of.
#   make demo   install what is missing, build, install, run the demo on 2 ranks
#   make test   install what is missing, build, run every test suite
# Both are safe to run again; they rebuild only what changed.

PREFIX    ?= /usr/local
JOBS      ?= $(shell nproc)
BUILD     ?= build
MPIRUN    ?= mpirun
MPIFLAGS  ?= --oversubscribe --bind-to none $(if $(filter 0,$(shell id -u)),--allow-run-as-root)

.PHONY: all deps build install demo test bench-allreduce clean

all: build

deps:
	@tools/setup/install_deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=$(PREFIX) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

install: build
	cmake --install $(BUILD) >/dev/null
	ldconfig 2>/dev/null || true
	@echo "tarantella: installed to $(PREFIX)"

demo: install
	$(MPIRUN) $(MPIFLAGS) -np 2 $(PREFIX)/bin/tnt-bench allreduce --min 4K --max 64M

test: build
	tests/run_all.sh $(BUILD)

clean:
	rm -rf build build-asan build-tsan
