"""What Tarantella needs and pip does not install with it: TensorFlow 2.21.

TensorFlow comes as two distributions that install the same `tensorflow`
package: `tensorflow` (GPU-capable on Linux) and `tensorflow-cpu`. The wheel
requires neither, since requiring one would install it beside a user's
other one (two distributions writing over each other's files); the extras
`tarantella[gpu]` and `tarantella[cpu]` install one for those who have none.
So this module, imported first by `import tarantella`, checks that the
Python has TensorFlow in the version Tarantella is built for, without
importing it, and otherwise raises an ImportError that says what to
install. It is also the one module that reads TensorFlow's and Keras's own
environment variables (KERAS_BACKEND, TF_NUM_INTRAOP_THREADS).
"""
import importlib.metadata
import importlib.util
import os
import re
import sys
import warnings

TENSORFLOW_VERSION = (2, 21)
_SPEC = "{dist}>={major}.{minor},<{major}.{next_minor}"

# Distributions that install the `tensorflow` package.
TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel",
                            "tensorflow-cpu-aws", "tensorflow-rocm", "tf-nightly", "tf-nightly-cpu")


def _requirement(dist):
    major, minor = TENSORFLOW_VERSION
    return _SPEC.format(dist=dist, major=major, minor=minor, next_minor=minor + 1)


def _what_to_install():
    return (f"pip install '{_requirement('tensorflow')}' (GPU-capable on Linux) or "
            f"pip install '{_requirement('tensorflow-cpu')}' (CPU only)")


def _major_minor(version):
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def installed_distributions(site_dir):
    """(name, version) of each TensorFlow distribution installed in site_dir
    (the directory that holds the `tensorflow` package that imports)."""
    found = []
    site_dir = os.path.realpath(site_dir)
    for name in TENSORFLOW_DISTRIBUTIONS:
        for dist in importlib.metadata.distributions(name=name):
            try:
                where = os.path.realpath(str(dist.locate_file("")))
            except Exception:  # a distribution not on the file system
                continue
            if where == site_dir and (name, dist.version) not in found:
                found.append((name, dist.version))
    return found


def check():
    """Raises ImportError naming what to install when this Python lacks
    TensorFlow 2.21; warns when two TensorFlow distributions share one
    package directory."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or spec.origin is None:
        # None: not installed. No origin: a `tensorflow` directory without
        # __init__.py, what uninstalling one of two distributions leaves.
        where = ""
        if spec is not None and spec.submodule_search_locations:
            where = (" (an incomplete tensorflow directory is in "
                     f"{list(spec.submodule_search_locations)[0]})")
        raise ImportError(
            f"Tarantella needs TensorFlow {TENSORFLOW_VERSION[0]}.{TENSORFLOW_VERSION[1]}, which "
            f"{sys.executable} cannot import{where}: {_what_to_install()}")
    site_dir = os.path.dirname(os.path.dirname(spec.origin))
    dists = installed_distributions(site_dir)
    if not dists:
        return  # built from source or installed without metadata: nothing to check
    for name, version in dists:
        if _major_minor(version) != TENSORFLOW_VERSION:
            raise ImportError(
                f"Tarantella needs TensorFlow {TENSORFLOW_VERSION[0]}.{TENSORFLOW_VERSION[1]}, but "
                f"{sys.executable} has {name} {version} (in {site_dir}): "
                f"pip install '{_requirement(name)}'")
    if len(dists) > 1:
        names = " and ".join(f"{n} {v}" for n, v in dists)
        warnings.warn(
            f"{names} are both installed in {site_dir}; they install the same tensorflow package "
            f"over each other. Keep one: pip uninstall {' '.join(n for n, _ in dists)}, then "
            f"{_what_to_install()}", stacklevel=3)


def check_keras_backend():
    """Tarantella trains with Keras on TensorFlow: another KERAS_BACKEND is
    an error that says what to set (before keras is imported, since another
    backend may not even import here)."""
    backend = os.environ.get("KERAS_BACKEND", "tensorflow").strip().lower()
    if backend != "tensorflow":
        raise ImportError(
            f"Keras runs on the {backend!r} backend (KERAS_BACKEND); Tarantella trains with "
            "TensorFlow: set KERAS_BACKEND=tensorflow (or remove the setting) before keras is "
            "imported")


def tensorflow_threads_chosen():
    """Whether the environment chose TensorFlow's intra-op threads
    (TF_NUM_INTRAOP_THREADS), which Tarantella then leaves as they are."""
    return bool(os.environ.get("TF_NUM_INTRAOP_THREADS", "").strip())


check()
check_keras_backend()
