"""Tarantella installed the way Python users install it: a wheel built from
the source tree (`pip wheel .`), installed with pip into a fresh virtual
environment, gives the package, libtnt and the `tarantella` launcher in the
environment's bin/, and the launcher trains the quick start on 2 ranks with
that environment's Python. The wheel requires no TensorFlow distribution;
`import tarantella` says what to install when TensorFlow 2.21 is missing.

The environment sees the system's site-packages (--system-site-packages),
so TensorFlow is not downloaded again; nothing is fetched from an index.
The wheel is built in the persistent build-py/ directory (pyproject.toml),
so that after `make install` it only relinks and packs; everything else
lives in pytest's temporary directories.
"""
import email.parser
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICK_START = os.path.join(ROOT, "examples", "quick_start.py")
REQUIREMENTS = os.path.join(ROOT, "python", "tarantella", "_requirements.py")


def project_version():
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        return re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M).group(1)


def clean_env(**extra):
    """The caller's environment without what would point Python elsewhere."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.update(extra)
    return env


def run(cmd, timeout, check=True, **kw):
    kw.setdefault("env", clean_env())
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, **kw)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(map(str, cmd))} did not finish within {timeout} s:\n"
                    f"{e.stdout}\n{e.stderr}")
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited with {proc.returncode}:\n"
                    f"{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    return proc


def make_venv(path, *flags):
    """Creates a virtual environment, or skips when this Python cannot."""
    proc = run([sys.executable, "-m", "venv", *flags, str(path)], timeout=300, check=False)
    if proc.returncode != 0:
        pytest.skip(f"{sys.executable} cannot create a virtual environment (on Debian: "
                    f"apt-get install python3-venv): {proc.stderr.strip()[-500:]}")
    return path


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel built from this source tree."""
    out = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
         "--no-index", "-w", str(out), ROOT], timeout=900, cwd=ROOT)
    wheels = glob.glob(str(out / "tarantella-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel):
    """A fresh environment over the system's packages, with the wheel installed
    by its own pip. The system may have Tarantella already (`make install`):
    --force-reinstall installs the wheel in the environment anyway, and
    --no-deps keeps pip from reinstalling numpy there (the requirements are
    checked in test_wheel_requires_no_tensorflow)."""
    path = make_venv(tmp_path_factory.mktemp("venv") / "env", "--system-site-packages")
    run([str(path / "bin" / "python"), "-m", "pip", "install", "--no-index", "--no-deps",
         "--force-reinstall", "--no-warn-script-location", wheel], timeout=300)
    return path


def venv_site_packages(venv):
    found = glob.glob(str(venv / "lib" / "python3*" / "site-packages"))
    assert len(found) == 1, found
    return found[0]


def activated(venv, **extra):
    """The environment an activated virtual environment gives."""
    return clean_env(PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                     VIRTUAL_ENV=str(venv), **extra)


def test_wheel_holds_package_library_and_launcher(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    version = project_version()
    for name in ("tarantella/__init__.py", "tarantella/_requirements.py", "tarantella/libtnt.so",
                 "tarantella/libtnt_tf_ops.so", f"tarantella-{version}.data/scripts/tarantella"):
        assert name in names, f"{name} is missing from {os.path.basename(wheel)}"
    assert any(re.fullmatch(r"tarantella/_core\..*\.so", n) for n in names), names
    info = zipfile.ZipFile(wheel).getinfo(f"tarantella-{version}.data/scripts/tarantella")
    assert (info.external_attr >> 16) & 0o111, "the launcher is not executable in the wheel"


def test_wheel_requires_no_tensorflow(wheel):
    """Neither `tensorflow` nor `tensorflow-cpu` unconditionally: either would
    install a second TensorFlow beside the other. The extras name one each."""
    with zipfile.ZipFile(wheel) as z:
        meta_name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(meta_name).decode())
    requires = meta.get_all("Requires-Dist") or []
    unconditional = [r for r in requires if "extra ==" not in r]
    assert not [r for r in unconditional
                if re.match(r"(tensorflow|tf-nightly|tf_nightly)", r)], requires
    assert set(meta.get_all("Provides-Extra")) >= {"cpu", "gpu"}
    assert any(r.startswith("tensorflow-cpu") and 'extra == "cpu"' in r for r in requires), requires
    assert any(r.startswith("tensorflow[and-cuda]") and 'extra == "gpu"' in r
               for r in requires), requires
    # What remains is already installed here (the environment relies on it).
    for r in unconditional:
        name = re.match(r"[A-Za-z0-9_.-]+", r).group(0)
        assert importlib.util.find_spec(name.replace("-", "_")) is not None, r


def test_launcher_in_bin_prints_its_version(venv):
    launcher = venv / "bin" / "tarantella"
    assert os.access(launcher, os.X_OK), f"pip did not install {launcher}"
    env = activated(venv)
    assert shutil.which("tarantella", path=env["PATH"]) == str(launcher)
    proc = run(["tarantella", "--version"], timeout=30, env=env)
    assert proc.stdout.strip() == f"tarantella {project_version()}"


def test_package_and_libtnt_come_from_the_environment(venv):
    """The environment's own copy, not the system's (`make install`), with
    libtnt loaded from beside the extension."""
    site = venv_site_packages(venv)
    code = ("import tarantella, tarantella._core; print(tarantella.__file__); "
            "print(*sorted({m.split()[-1] for m in open('/proc/self/maps') if 'libtnt' in m}),"
            " sep='\\n')")
    proc = run([str(venv / "bin" / "python"), "-c", code], timeout=120)
    lines = proc.stdout.split()
    assert lines[0] == os.path.join(site, "tarantella", "__init__.py"), proc.stdout
    libs = [line for line in lines[1:] if "libtnt.so" in line]
    assert libs == [os.path.join(site, "tarantella", "libtnt.so")], proc.stdout


def test_launcher_runs_scripts_with_its_environments_python(venv, tmp_path):
    """venv/bin/tarantella, run without activating the environment, still
    chooses the environment's Python, though a python3 on PATH may have
    Tarantella too; --python-interpreter still wins."""
    launcher = str(venv / "bin" / "tarantella")
    env = clean_env()
    args = ["--dry-run", "--no-gpu", "-n", "2", "--run-dir", str(tmp_path / "run"), "--",
            QUICK_START]
    out = run([launcher] + args, timeout=60, env=env, cwd=tmp_path).stdout
    words = out.splitlines()[-1].split()
    assert words[words.index(QUICK_START) - 1] == str(venv / "bin" / "python3"), words
    words = run([launcher, "--python-interpreter", sys.executable] + args, timeout=60, env=env,
                cwd=tmp_path).stdout.splitlines()[-1].split()
    assert words[words.index(QUICK_START) - 1] == sys.executable, words


def test_quick_start_on_two_ranks(venv, tmp_path):
    """The issue's own check: `tarantella -n 2 -- examples/quick_start.py` in
    the activated environment (a short run)."""
    proc = run(["tarantella", "-n", "2", "--run-dir", str(tmp_path / "run"), "--", QUICK_START,
                "--train_size", "2048", "--epochs", "1"],
               timeout=600, env=activated(venv, TNT_TIMEOUT_S="120"), cwd=tmp_path)
    assert re.search(r"test accuracy 0\.\d+ \(2 ranks", proc.stdout), proc.stdout + proc.stderr


# ------------------------------------------------ the TensorFlow check alone

def fake_site(path, *dists):
    """A site directory with a `tensorflow` package and dist-info metadata
    for each (name, version) in dists."""
    (path / "tensorflow").mkdir(parents=True)
    (path / "tensorflow" / "__init__.py").write_text("")
    for name, version in dists:
        info = path / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return path


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A Python that sees no site-packages but those given on PYTHONPATH."""
    path = make_venv(tmp_path_factory.mktemp("bare") / "env", "--without-pip")
    return str(path / "bin" / "python")


def check_requirements(python, site, *flags):
    """Runs _requirements.py's check with only `site` beside the standard library."""
    code = (f"import importlib.util as u; s = u.spec_from_file_location('req', {REQUIREMENTS!r}); "
            f"m = u.module_from_spec(s); s.loader.exec_module(m); print('ok')")
    return run([python, *flags, "-c", code], timeout=60, check=False,
               env=clean_env(PYTHONPATH=str(site)))


def test_import_without_tensorflow_says_what_to_install(venv, bare_python):
    """The installed package in an environment without TensorFlow."""
    proc = run([bare_python, "-c", "import tarantella"], timeout=60, check=False,
               env=clean_env(PYTHONPATH=venv_site_packages(venv)))
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: Tarantella needs TensorFlow 2.21"), proc.stderr
    assert "pip install 'tensorflow>=2.21,<2.22'" in last and "tensorflow-cpu" in last, last


def test_wrong_tensorflow_version_says_what_to_install(bare_python, tmp_path):
    site = fake_site(tmp_path / "site", ("tensorflow", "2.20.1"))
    proc = check_requirements(bare_python, site)
    assert proc.returncode != 0
    assert "has tensorflow 2.20.1" in proc.stderr, proc.stderr
    assert "pip install 'tensorflow>=2.21,<2.22'" in proc.stderr, proc.stderr


@pytest.mark.parametrize("dist", ["tensorflow", "tensorflow-cpu"])
def test_either_tensorflow_distribution_is_accepted(bare_python, tmp_path, dist):
    site = fake_site(tmp_path / "site", (dist, "2.21.0"))
    proc = check_requirements(bare_python, site, "-W", "error")
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_two_tensorflow_distributions_in_one_directory_warn(bare_python, tmp_path):
    site = fake_site(tmp_path / "site", ("tensorflow", "2.21.0"), ("tensorflow-cpu", "2.21.0"))
    proc = check_requirements(bare_python, site)
    assert proc.returncode == 0, proc.stderr
    assert ("tensorflow 2.21.0 and tensorflow-cpu 2.21.0 are both installed"
            in proc.stderr), proc.stderr
