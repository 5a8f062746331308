# Tarantella: the two commands of the README, and the steps they are made of.
#   make demo   install what is missing, build, install, train the quick start on 2 ranks
#               (with the tarantella launcher)
#   make test   install what is missing, build, install, run every test suite
#               but the long tests (the tiers below but test-long), in
#               tests/run_all.py, which counts results from JUnit XML
#               (build/test-results/) and prints each tier's time
#   make bench  install, run the benchmark suite, write bench/results/summary.md
#               (make bench QUICK=1: a short version)
# The test tiers, each a part of make test (tests/run_all.py TIER runs one):
#   make check  build, stage the Python package in build/python (pip --target,
#               nothing installed, no root), ruff, then the C unit and
#               threaded tests (ctest -L 'unit|threads') and the Python tests
#               that start no ranks (pytest -m "not ranks"): a few minutes
#   make test-mpi         build, the C tests under mpirun and on SimGrid
#                         (ctest -L 'mpi|sim')
#   make test-sanitizers  the C tests built with ASan+UBSan, the threaded
#                         ones with TSan (build-asan, build-tsan)
#   make test-launcher    install, the launcher's end-to-end tests, its fuzz
#                         targets, the bad-input matrix (tests/reliability)
#   make test-python      install, the Python tests that start ranks
#                         (pytest -m ranks), the wheel (tests/packaging)
#   make test-long        install, the tests marked `long` that make test
#                         leaves out: random kill trials, soak, 4-rank training
# ctest labels (tests/CMakeLists.txt) and pytest markers (pyproject.toml,
# tests/python/conftest.py) select the tests of a tier.
# All are safe to run again; they rebuild only what changed.

PREFIX    ?= /usr/local
PYTHON    ?= python3
JOBS      ?= $(shell nproc)
BUILD     ?= build
MPIRUN    ?= mpirun
MPIFLAGS  ?= --oversubscribe --bind-to none $(if $(filter 0,$(shell id -u)),--allow-run-as-root)

export PYTHON

.PHONY: all deps build stage install demo test check test-mpi test-sanitizers test-launcher \
        test-python test-long bench clean

all: build

deps:
	@tools/setup/install_deps.sh

# The C library, its tools and tests.
build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=$(PREFIX) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

# The Python package built from this tree (build-py/) and copied to
# $(BUILD)/python, whence `make check` imports it: nothing is installed.
stage: build
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(PYTHON) -m pip install --quiet --root-user-action=ignore \
	  --no-build-isolation --no-deps --upgrade --target $(BUILD)/python .

# libtnt and tnt-bench under PREFIX, and the Python package for $(PYTHON).
install: build
	cmake --install $(BUILD) >/dev/null
	ldconfig 2>/dev/null || true
	$(PYTHON) -m pip install --quiet --root-user-action=ignore --no-build-isolation .
	@echo "tarantella: installed libtnt and tnt-bench to $(PREFIX), and the Python package"

demo: install
	TF_CPP_MIN_LOG_LEVEL=2 $(PREFIX)/bin/tarantella --no-gpu -n 2 --python-interpreter $(PYTHON) \
	  -- examples/quick_start.py --epochs 3

test: install stage
	$(PYTHON) tests/run_all.py --build $(BUILD)

check: stage
	$(PYTHON) -m ruff check python tests tools examples
	$(PYTHON) tests/run_all.py --build $(BUILD) check

test-mpi: build
	$(PYTHON) tests/run_all.py --build $(BUILD) mpi

test-sanitizers: deps
	$(PYTHON) tests/run_all.py --build $(BUILD) sanitizers

test-launcher test-python test-long: install
	$(PYTHON) tests/run_all.py --build $(BUILD) $(@:test-%=%)

# Every stage of tools/bench/run_bench.sh (STAGES=a,b runs some): results
# files (JSON lines), plots, summary.md and details.md in bench/results.
bench: install
	@tools/setup/install_deps.sh bench
	PREFIX=$(PREFIX) MPIRUN=$(MPIRUN) MPIFLAGS="$(MPIFLAGS)" BUILD=$(abspath $(BUILD)) \
	  tools/bench/run_bench.sh $(if $(filter-out 0,$(QUICK)),--quick) $(if $(STAGES),--only $(STAGES))

clean:
	rm -rf build build-asan build-tsan build-py build-fuzz
