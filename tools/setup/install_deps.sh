#!/usr/bin/env bash
# Installs what building, testing and running Tarantella needs and is
# missing: Debian packages with apt-get (as root, or through sudo), Python
# packages with the pip of $PYTHON (default: python3 on PATH). Safe to
# re-run; it does nothing when everything is present.
#
#   install_deps.sh         what building, testing and running need
#   install_deps.sh bench   that, and what `make bench` needs (matplotlib)
set -euo pipefail

PYTHON=${PYTHON:-python3}

# graphviz and pydot: keras.utils.plot_model in the tests; slurmctld, slurmd
# and slurm-client: the launcher's test in a real Slurm allocation
# (tests/launcher/test_slurm.py starts its own daemons with a configuration
# of its own; the packages' services need /etc/slurm/slurm.conf, which this
# script does not write, so they stay off)
DEB_PACKAGES=(build-essential cmake pkg-config libopenmpi-dev openmpi-bin libcmocka-dev libsimgrid-dev
              clang libclang-rt-14-dev numactl iproute2 dataset-fashion-mnist graphviz
              slurmctld slurmd slurm-client)
# name as pip knows it, and the module that shows it is importable. TensorFlow
# is installed only where none imports: tensorflow-cpu, as the CI machines
# have no GPU; a machine with `tensorflow` (the GPU-capable package) keeps it,
# since both install the same module and the Python package requires neither
# (pyproject.toml). ruff: the Python linter of `make check`.
PY_PACKAGES=("tensorflow-cpu>=2.21,<2.22:tensorflow" "scikit-build-core>=0.10:scikit_build_core"
             "pytest:pytest" "numpy:numpy" "tensorboard:tensorboard" "pydot:pydot" "ruff:ruff")
# only for `make bench`: the plots of the benchmark report; and tf-keras, the
# Keras that MultiWorkerMirroredStrategy trains with on TF 2.21, installed
# without its dependencies (it would pull the full tensorflow package over
# tensorflow-cpu)
BENCH_PY_PACKAGES=("matplotlib:matplotlib")
NODEPS_PY_PACKAGES=()
case "${1:-}" in
  "") ;;
  bench)
    PY_PACKAGES+=("${BENCH_PY_PACKAGES[@]}")
    NODEPS_PY_PACKAGES+=("tf-keras>=2.21,<2.22:tf_keras")
    ;;
  *) echo "usage: $0 [bench]" >&2; exit 2 ;;
esac

missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "tarantella: installing Debian packages: ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

py_missing=()
for entry in "${PY_PACKAGES[@]}"; do
  spec=${entry%%:*}
  module=${entry##*:}
  "$PYTHON" -c "import $module" 2>/dev/null || py_missing+=("$spec")
done
if ((${#py_missing[@]})); then
  echo "tarantella: installing Python packages: ${py_missing[*]}"
  "$PYTHON" -m pip install --quiet --root-user-action=ignore "${py_missing[@]}"
fi

nodeps_missing=()
for entry in "${NODEPS_PY_PACKAGES[@]}"; do
  "$PYTHON" -c "import ${entry##*:}" 2>/dev/null || nodeps_missing+=("${entry%%:*}")
done
if ((${#nodeps_missing[@]})); then
  echo "tarantella: installing Python packages without dependencies: ${nodeps_missing[*]}"
  "$PYTHON" -m pip install --quiet --root-user-action=ignore --no-deps "${nodeps_missing[@]}"
fi
