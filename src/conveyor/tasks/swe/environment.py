"""Per-project sources and test environments, built once and cached under `swe_home()`.

- `project_source(name, version)`: the sdist from PyPI (`pip download --no-binary :all:`),
  unpacked once into `<home>/src/<name>-<version>`: the pristine tree every task starts from.
- `test_environment(deps)`: a venv with pytest, coverage and the task's extra test dependencies,
  keyed by its dependency list; mounted read-only into every sandbox, the policy's too. The
  shared venv is never changed per task: the project is imported from the workspace
  (`environment.pythonpath`). The grader's own code (outcome plugin and bootstrap) is not in it:
  it lives in `grader_dir()`, `<home>/grader/<hash of its sources>`, mounted only into the
  grader's sandboxes, so the policy's sandbox cannot read it;
- `project_metadata(name, version)`: the project's own `.dist-info` (built once from its sdist
  with `pip wheel --no-deps`), a folder put on `sys.path` next to the workspace, so
  `importlib.metadata` and the project's entry points work as if it were installed without its
  dependencies. It is made from the pristine sdist: a patch cannot add entry points or change
  the version.
- `task_template(row)`: the task's starting state, the pristine tree plus `setup_patch`.

Everything is made in a temporary folder and renamed into place under a file lock, so concurrent
processes build each thing once and never see a half-made one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from conveyor.tasks.swe.patches import apply_patch

PLUGIN_MODULE = "conveyor_outcomes"
BOOTSTRAP_SCRIPT = "conveyor_pytest.py"
BASE_TEST_DEPS = ("pytest", "coverage")
_PIP_TIMEOUT_S = 900
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class EnvironmentError_(RuntimeError):
    """A source or environment could not be made (download, unpack, install failed)."""


def swe_home() -> Path:
    """Cache root: `$CONVEYOR_SWE_HOME`, default `~/.cache/conveyor/swe` (never in the repo)."""
    return Path(os.environ.get("CONVEYOR_SWE_HOME", "~/.cache/conveyor/swe")).expanduser()


def safe_name(text: str) -> str:
    """`text` usable as one file name."""
    return _SAFE.sub("_", text)[:120]


@contextlib.contextmanager
def locked(key: str) -> Iterator[None]:
    """An exclusive inter-process lock named `key` (a file under `<home>/locks`)."""
    folder = swe_home() / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{safe_name(key)}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(argv: list[str], *, cwd: Path | None = None, timeout: float = _PIP_TIMEOUT_S) -> str:
    done = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-2000:]
        raise EnvironmentError_(f"{' '.join(argv[:4])} ... failed: {tail}")
    return done.stdout


def fetch_sdist(name: str, version: str | None = None) -> Path:
    """The sdist archive of `name` (`version`, or the newest), downloaded once with pip."""
    folder = swe_home() / "sdists"
    folder.mkdir(parents=True, exist_ok=True)
    if version is not None:
        cached = _find_archive(folder, name, version)
        if cached is not None:
            return cached
    spec = f"{name}=={version}" if version else name
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        _run([*pip, "-q", spec, "-d", tmp])
        archives = list(Path(tmp).iterdir())
        if len(archives) != 1:
            raise EnvironmentError_(f"pip download {spec} gave {len(archives)} files")
        target = folder / archives[0].name
        os.replace(archives[0], target)
    return target


def _find_archive(folder: Path, name: str, version: str) -> Path | None:
    stems = {f"{name}-{version}", f"{name.replace('-', '_')}-{version}"}
    for path in folder.iterdir():
        stem = path.name.removesuffix(".tar.gz").removesuffix(".zip").removesuffix(".tar.bz2")
        if stem.lower() in {s.lower() for s in stems}:
            return path
    return None


def archive_version(archive: Path, name: str) -> str:
    """The version in an sdist's file name (`toolz-1.2.0.tar.gz` -> `1.2.0`)."""
    stem = archive.name
    for suffix in (".tar.gz", ".tar.bz2", ".zip", ".tgz"):
        stem = stem.removesuffix(suffix)
    return stem[len(name) + 1 :] if len(stem) > len(name) else stem


def project_source(name: str, version: str | None = None) -> tuple[Path, str]:
    """The pristine unpacked sdist of `name` and its version (downloaded and unpacked once)."""
    if version is not None:
        root = swe_home() / "src" / f"{safe_name(name)}-{safe_name(version)}"
        if root.is_dir():
            return root, version
    archive = fetch_sdist(name, version)
    version = version or archive_version(archive, name)
    root = swe_home() / "src" / f"{safe_name(name)}-{safe_name(version)}"
    with locked(f"src-{name}-{version}"):
        if root.is_dir():
            return root, version
        root.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
            _unpack(archive, Path(tmp))
            tops = list(Path(tmp).iterdir())
            top = tops[0] if len(tops) == 1 and tops[0].is_dir() else Path(tmp)
            for leftover in top.glob("*.egg-info"):
                shutil.rmtree(leftover, ignore_errors=True)
            os.replace(top, root)
    return root, version


def _unpack(archive: Path, into: Path) -> None:
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as bundle:
            bundle.extractall(into)
        return
    with tarfile.open(archive) as bundle:
        bundle.extractall(into, filter="data")


@dataclass(frozen=True)
class TestEnvironment:
    """A built venv: its folder and what it holds, plus the grader's folder (`plugin_dir`: the
    outcome plugin and bootstrap, outside the venv; mounted only where the grader runs tests)."""

    path: Path
    plugin_dir: Path
    site_packages: Path
    top_level_modules: tuple[str, ...]

    __test__ = False

    @property
    def python(self) -> Path:
        """The venv's interpreter."""
        return self.path / "bin" / "python"

    @property
    def bootstrap(self) -> Path:
        """The grader's pytest entry point (`pytest_bootstrap.py`) in the grader's folder."""
        return self.plugin_dir / BOOTSTRAP_SCRIPT


def _plugin_files() -> dict[str, str]:
    here = Path(__file__).parent
    return {
        f"{PLUGIN_MODULE}.py": (here / "outcomes_plugin.py").read_text(),
        BOOTSTRAP_SCRIPT: (here / "pytest_bootstrap.py").read_text(),
        # The bootstrap's helpers: its audit hook, its snapshot and plugin check.
        "conveyor_audit.py": (here / "pytest_audit.py").read_text(),
        "conveyor_audit_files.py": (here / "pytest_audit_files.py").read_text(),
        "conveyor_pins.py": (here / "pytest_pins.py").read_text(),
        "conveyor_trust.py": (here / "pytest_trust.py").read_text(),
    }


def grader_dir() -> Path:
    """The grader's folder, `<home>/grader/<hash>`: the outcome plugin and the bootstrap, as
    this version of conveyor ships them. Outside every venv and workspace, so no policy sandbox
    mounts it; the grader mounts it read-only into its own sandboxes only. Written once per
    version (checked on every call: a file that differs is written again)."""
    files = _plugin_files()
    key = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:12]
    path = swe_home() / "grader" / key
    if _holds(path, files):
        return path
    with locked(f"grader-{key}"):
        if not _holds(path, files):
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
                staging = Path(tmp) / "grader"
                staging.mkdir()
                for name, text in files.items():
                    (staging / name).write_text(text)
                    os.chmod(staging / name, 0o644)
                os.chmod(staging, 0o755)  # the sandbox user reads it where it is mounted
                shutil.rmtree(path, ignore_errors=True)
                os.replace(staging, path)
    return path


def _holds(path: Path, files: dict[str, str]) -> bool:
    try:
        return all((path / name).read_text() == text for name, text in files.items())
    except OSError:
        return False


def test_environment(extra_deps: list[str] | tuple[str, ...] = ()) -> TestEnvironment:
    """The venv with pytest, coverage and `extra_deps`, built once per dependency list, and the
    grader's folder (`grader_dir`)."""
    deps = sorted({*BASE_TEST_DEPS, *extra_deps})
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    # The grader's code is not part of the key: it is not in the venv (see `grader_dir`).
    key = hashlib.sha256(json.dumps([version, deps, "no-plugins"]).encode()).hexdigest()[:12]
    path = swe_home() / "envs" / f"py{version}-{key}"
    with locked(f"env-{key}"):
        if not (path / "conveyor-env.json").exists():
            _build_env(path, deps)
    info = json.loads((path / "conveyor-env.json").read_text())
    return TestEnvironment(
        path=path,
        plugin_dir=grader_dir(),
        site_packages=Path(info["site_packages"]),
        top_level_modules=tuple(info["top_level_modules"]),
    )


def _build_env(path: Path, deps: list[str]) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    base = getattr(sys, "_base_executable", sys.executable)
    _run([base, "-m", "venv", str(path)])
    python = str(path / "bin" / "python")
    _run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *deps])
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    site_packages = Path(site.strip())
    tops = sorted(
        {
            entry.name.removesuffix(".py")
            for entry in site_packages.iterdir()
            if not entry.name.endswith((".dist-info", ".pth", ".egg-info")) and entry.name[0] != "_"
        }
        | {PLUGIN_MODULE, "_pytest"}
        | {"conveyor_audit", "conveyor_audit_files", "conveyor_pins", "conveyor_trust"}
    )
    record = {"deps": deps, "site_packages": str(site_packages), "top_level_modules": tops}
    (path / "conveyor-env.json").write_text(json.dumps(record, indent=1))
    os.chmod(path, 0o755)


def task_template(name: str, version: str, setup_patch: str, key: str) -> Path:
    """The task's starting state: the pristine sdist of `name`/`version` plus `setup_patch`.

    Cached per (`key`, patch hash); an empty `setup_patch` shares the pristine tree.
    """
    source, _ = project_source(name, version)
    if not setup_patch.strip():
        return source
    digest = hashlib.sha256(setup_patch.encode()).hexdigest()[:12]
    path = swe_home() / "templates" / f"{safe_name(key)}-{digest}"
    if path.is_dir():
        return path
    with locked(f"template-{key}-{digest}"):
        if path.is_dir():
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            staging = Path(tmp) / "tree"
            shutil.copytree(source, staging, symlinks=True)
            apply_patch(staging, setup_patch)
            os.replace(staging, path)
    return path


def project_metadata(name: str, version: str) -> Path:
    """A folder holding the project's `.dist-info` (see the module doc), built once per release.

    Built with the host's pip from the pristine sdist (never from a workspace), so the entry
    points and version a test sees are the release's. A project whose wheel cannot be built
    here gets a minimal `.dist-info` from the sdist's `PKG-INFO` (name and version, no entry
    points) rather than none.
    """
    path = swe_home() / "metadata" / f"{safe_name(name)}-{safe_name(version)}"
    if (path / "conveyor-metadata.json").exists():
        return path / "site"
    with locked(f"metadata-{name}-{version}"):
        if not (path / "conveyor-metadata.json").exists():
            _build_metadata(path, name, version)
    return path / "site"


def _build_metadata(path: Path, name: str, version: str) -> None:
    source, _ = project_source(name, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        staging = Path(tmp) / "out"
        site = staging / "site"
        site.mkdir(parents=True)
        how = "wheel"
        try:
            _metadata_from_wheel(source, Path(tmp), site)
        except (EnvironmentError_, subprocess.TimeoutExpired, zipfile.BadZipFile) as exc:
            how = f"PKG-INFO only (the wheel did not build: {str(exc)[-300:]})"
            _metadata_from_pkg_info(source, site, name, version)
        record = {"name": name, "version": version, "made_from": how}
        (staging / "conveyor-metadata.json").write_text(json.dumps(record, indent=1))
        for folder, _, files in os.walk(staging):
            os.chmod(folder, 0o755)
            for file in files:
                os.chmod(Path(folder) / file, 0o644)
        shutil.rmtree(path, ignore_errors=True)
        os.replace(staging, path)


def _metadata_from_wheel(source: Path, tmp: Path, site: Path) -> None:
    # A copy: building writes build/ and *.egg-info into the tree, and the sdist stays pristine.
    tree = tmp / "tree"
    shutil.copytree(source, tree, symlinks=True)
    wheels = tmp / "wheels"
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "--disable-pip-version-check"]
    _run([*pip, "-w", str(wheels), str(tree)])
    built = sorted(wheels.glob("*.whl"))
    if len(built) != 1:
        raise EnvironmentError_(f"pip wheel made {len(built)} wheels")
    with zipfile.ZipFile(built[0]) as wheel:
        for member in wheel.namelist():
            top = member.split("/")[0]
            if top.endswith(".dist-info") and not member.endswith("/RECORD"):
                wheel.extract(member, site)


def _metadata_from_pkg_info(source: Path, site: Path, name: str, version: str) -> None:
    pkg_info = source / "PKG-INFO"
    text = pkg_info.read_text(errors="replace") if pkg_info.exists() else ""
    if not text:
        text = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    folder = site / f"{safe_name(name).replace('-', '_')}-{safe_name(version)}.dist-info"
    folder.mkdir()
    (folder / "METADATA").write_text(text)
    (folder / "INSTALLER").write_text("conveyor\n")
