# Tarantella: the two commands of the README, and the steps they are made of.
#   make demo   install what is missing, build, install, train the quick start on 2 ranks
#               (with the tarantella launcher)
#   make test   install what is missing, build, install, run every test suite
#   make test-long  install, then the long tests make test leaves out (the
#               tests marked `long`: random kill trials, soak, 4-rank training)
#   make bench  install, run the benchmark suite, write bench/results/summary.md
#               (make bench QUICK=1: a short version)
# All are safe to run again; they rebuild only what changed.

PREFIX    ?= /usr/local
PYTHON    ?= python3
JOBS      ?= $(shell nproc)
BUILD     ?= build
MPIRUN    ?= mpirun
MPIFLAGS  ?= --oversubscribe --bind-to none $(if $(filter 0,$(shell id -u)),--allow-run-as-root)

export PYTHON

.PHONY: all deps build install demo test test-long bench clean

all: build

deps:
	@tools/setup/install_deps.sh

# The C library, its tools and tests.
build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=$(PREFIX) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

# libtnt and tnt-bench under PREFIX, and the Python package for $(PYTHON).
install: build
	cmake --install $(BUILD) >/dev/null
	ldconfig 2>/dev/null || true
	$(PYTHON) -m pip install --quiet --root-user-action=ignore --no-build-isolation .
	@echo "tarantella: installed libtnt and tnt-bench to $(PREFIX), and the Python package"

demo: install
	TF_CPP_MIN_LOG_LEVEL=2 $(PREFIX)/bin/tarantella --no-gpu -n 2 --python-interpreter $(PYTHON) \
	  -- examples/quick_start.py --epochs 3

test: install
	tests/run_all.sh $(BUILD)

test-long: install
	tests/run_all.sh --long $(BUILD)

# Collectives against MPI, framework overhead, fusion threshold sweep,
# training against other frameworks, simulated cluster: JSON, plots and
# summary.md in bench/results (tools/bench/run_bench.sh).
bench: install
	@tools/setup/install_deps.sh bench
	PREFIX=$(PREFIX) MPIRUN=$(MPIRUN) MPIFLAGS="$(MPIFLAGS)" BUILD=$(abspath $(BUILD)) \
	  tools/bench/run_bench.sh $(if $(filter-out 0,$(QUICK)),--quick) $(if $(STAGES),--only $(STAGES))

clean:
	rm -rf build build-asan build-tsan build-py build-fuzz
