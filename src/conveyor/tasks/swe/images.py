"""Per-task container images of SWE rows, built on this machine and keyed by their inputs.

Two layers over the base image (`conveyor.runtime.images`, Debian + python3):

- the test environment, `conveyor-swe-env:<hash>`: a venv at `/opt/conveyor/venv` with pytest,
  coverage and the row's `extra_test_deps`, installed offline from wheels that the host's pip
  downloads for the image's Python (`--only-binary :all:`, the build itself has no network),
  and `/opt/conveyor/env.json` describing it (its site-packages and top-level modules, which
  the tree guard protects). Shared by every row with the same dependency list;
- the task, `conveyor-swe-task-<instance>:<hash>`: the row's starting state (the release's
  pristine source plus its `setup_patch`) at `/testbed`, and the project's own `.dist-info`
  (built from the pristine sdist) at `/opt/conveyor/metadata`, so the project imports from
  `/testbed` as if installed.

The tag's hash covers the inputs: the base image's tag, the dependency list, the bytes and
modes of every file of the starting state and the metadata, and `IMAGE_VERSION`; an unchanged
row finds its image in the engine's store, a changed one gets a new tag. (It covers the
dependency list, not the versions PyPI resolves it to.) Nothing in an image depends on a host
path: the grader's own code (the pytest bootstrap and outcome plugin) is mounted read-only at
`/conveyor/grader` by the grader only, and the run's settings at `/conveyor/run`.

`runtime.image` (a template, e.g. `swebench/sweb.eval.x86_64.{instance_id}`) names images a
user pulled instead; they must hold the same layout.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from conveyor.config.sections import RuntimeConfig
from conveyor.models import cache_dir
from conveyor.runtime.engine import Engine, resolve_engine
from conveyor.runtime.images import (
    BuiltImage,
    ImageBuildError,
    MissingImages,
    build_image,
    ensure_base_image,
    image_exists,
    stored_image,
)
from conveyor.tasks.swe.dataset import SweRow
from conveyor.tasks.swe.environment import BASE_TEST_DEPS, TestEnvironment

IMAGE_VERSION = 1
VENV = "/opt/conveyor/venv"
METADATA = "/opt/conveyor/metadata"
ENV_JSON = "/opt/conveyor/env.json"
TESTBED = "/testbed"
GRADER = "/conveyor/grader"
RUN_DIR = "/conveyor/run"
BUILD_COMMAND = "conveyor images build --config <your config>"
_NAME = re.compile(r"[^a-z0-9._-]+")

# Run by the image's venv at build time: what `environment._build_env` records for host venvs.
_DESCRIBE = """\
import json, sys, sysconfig
from pathlib import Path
site = Path(sysconfig.get_paths()["purelib"])
tops = sorted(
    {e.name.removesuffix(".py") for e in site.iterdir()
     if not e.name.endswith((".dist-info", ".pth", ".egg-info")) and e.name[0] != "_"}
    | set(sys.argv[1:])
)
print(json.dumps({"site_packages": str(site), "top_level_modules": tops}))
"""
# Modules the grader adds beside the venv's (as `environment._build_env` does).
_GRADER_MODULES = (
    "conveyor_outcomes",
    "_pytest",
    "conveyor_audit",
    "conveyor_audit_files",
    "conveyor_pins",
    "conveyor_trust",
)


def _hash(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=4096)
def tree_digest(root: Path) -> str:
    """A hash of every file under `root`: relative paths, executable bits, bytes (symlinks by
    their target). Remembered per path for the process: the trees it hashes (pristine
    sources, starting states, metadata under the SWE cache) never change once made."""
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = Path(folder) / name
            rel = path.relative_to(root).as_posix()
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                digest.update(f"L {rel} {os.readlink(path)}\n".encode())
                continue
            digest.update(f"F {rel} {info.st_mode & 0o111:o} {info.st_size}\n".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def image_python(engine: Engine, base_tag: str) -> str:
    """The base image's Python version, `3.11`."""
    done = engine.run(
        "run", "--rm", "--network", "none", base_tag, "python3", "-c",
        "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')",
        timeout_s=120,
    )  # fmt: skip
    if done.returncode != 0:
        raise ImageBuildError(f"cannot run python3 in {base_tag}: {done.stderr.strip()}")
    return done.stdout.strip()


def env_deps(row: SweRow) -> list[str]:
    """The test environment's dependency list of `row`."""
    return sorted({*BASE_TEST_DEPS, *row.env.extra_test_deps})


def env_tag(base_tag: str, deps: list[str]) -> str:
    """The test environment image's tag for `deps` over `base_tag`."""
    return f"conveyor-swe-env:{_hash([IMAGE_VERSION, base_tag, deps])}"


@dataclass(frozen=True)
class TaskImage:
    """What one row's image is made of, and its tag."""

    instance_id: str
    tag: str
    env_tag: str
    base_tag: str
    deps: tuple[str, ...]
    template: Path
    metadata: Path | None


def _slug(instance_id: str) -> str:
    return _NAME.sub("-", instance_id.lower()).strip("-._")[:100] or "task"


def plan_row(row: SweRow, base_tag: str) -> TaskImage:
    """The image of a `pypi:` row over `base_tag` (its starting state and metadata are made on
    this host, cached); `ValueError` for a row whose source Conveyor cannot make."""
    from conveyor.tasks.swe.grading import row_metadata, row_template

    template = row_template(row)
    metadata = row_metadata(row)
    deps = env_deps(row)
    etag = env_tag(base_tag, deps)
    inputs = [IMAGE_VERSION, etag, tree_digest(template)]
    inputs.append(tree_digest(metadata) if metadata is not None else None)
    tag = f"conveyor-swe-task-{_slug(row.instance_id)}:{_hash(inputs)}"
    return TaskImage(row.instance_id, tag, etag, base_tag, tuple(deps), template, metadata)


def templated_image(template: str, row: SweRow) -> str:
    """`runtime.image` filled with the row's fields; `ValueError` naming an unknown field."""
    fields = {"instance_id": row.instance_id, "repo": row.repo, "version": row.version}
    try:
        return template.format(**fields)
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(
            f"runtime.image {template!r}: unknown field {exc}; use {{instance_id}}, {{repo}}, "
            "{version}"
        ) from None


def row_image(row: SweRow, settings: RuntimeConfig) -> str:
    """The image `row` runs in: `runtime.image` filled in, else its locally built image (over
    the base image of this machine's recipe)."""
    if settings.image:
        return templated_image(settings.image, row)
    return plan_row(row, _base_tag()).tag


def _base_tag() -> str:
    from conveyor.runtime.images import default_recipe

    return default_recipe().tag


_PRESENT: set[tuple[Engine, str]] = set()


def image_present(engine: Engine, image: str) -> bool:
    """`image_exists`, remembering the images found for the process (a rollout asks for its
    row's image several times; one removed meanwhile fails its container's start instead)."""
    if (engine, image) in _PRESENT:
        return True
    if image_exists(engine, image):
        _PRESENT.add((engine, image))
        return True
    return False


def missing_images(rows: Iterable[SweRow], settings: RuntimeConfig) -> list[tuple[str, str]]:
    """(instance_id, image) of every row whose image the engine's store lacks."""
    engine = resolve_engine(settings.engine)
    missing = []
    for row in rows:
        image = row_image(row, settings)
        if not image_present(engine, image):
            missing.append((row.instance_id, image))
    return missing


def how_to_get(settings: RuntimeConfig) -> str:
    """What a user runs to get missing images."""
    if settings.image:
        return f"pull them first (runtime.image is {settings.image!r}; no image is built for it)"
    return f"build them first with `{BUILD_COMMAND}`"


def check_images(rows: Iterable[SweRow], settings: RuntimeConfig) -> None:
    """`MissingImages` (a `ValueError`) listing the rows whose image is missing."""
    missing = missing_images(rows, settings)
    if missing:
        raise MissingImages(missing, how_to_get(settings))


def _wheels(deps: tuple[str, ...], python: str) -> Path:
    """Wheels of `deps` (and pip) for the image's Python on this machine's architecture,
    downloaded once by the host's pip (its index and certificates)."""
    folder = cache_dir() / "containers" / "wheels" / _hash([python, list(deps)])
    if (folder / "done").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="wheels-", dir=folder.parent))
    arch = platform.machine()
    platforms = [f"manylinux_2_{minor}_{arch}" for minor in (17, 28, 34, 36, 5, 12)]
    platforms += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]
    argv = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check"]
    argv += ["--only-binary", ":all:", "--python-version", python, "--implementation", "cp"]
    for tag in platforms:
        argv += ["--platform", tag]
    argv += ["-d", str(tmp), "pip", *deps]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        why = (done.stderr or done.stdout).strip()[-1500:]
        raise ImageBuildError(f"downloading wheels of {list(deps)} for Python {python}: {why}")
    (tmp / "done").write_text("")
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return folder


def ensure_env_image(engine: Engine, base_tag: str, deps: tuple[str, ...]) -> BuiltImage:
    """The test environment image of `deps` (see the module doc), built if missing."""
    tag = env_tag(base_tag, list(deps))
    if (found := stored_image(engine, tag)) is not None:
        return found
    wheels = _wheels(deps, image_python(engine, base_tag))
    pip = sorted(p.name for p in wheels.glob("pip-*.whl"))[-1]
    with tempfile.TemporaryDirectory(prefix="conveyor-env-image-") as scratch:
        context = Path(scratch)
        shutil.copytree(wheels, context / "wheels")
        (context / "describe.py").write_text(_DESCRIBE)
        install = f"{VENV}/bin/python /w/{pip}/pip install -q --no-index --find-links /w "
        install += "--no-cache-dir --disable-pip-version-check --no-compile " + " ".join(deps)
        containerfile = (
            f"FROM {base_tag}\n"
            f"RUN --mount=type=bind,source=wheels,target=/w python3 -m venv --without-pip {VENV}"
            f" && {install}\n"
            f"COPY describe.py /opt/conveyor/describe.py\n"
            f"RUN {VENV}/bin/python /opt/conveyor/describe.py {' '.join(_GRADER_MODULES)} "
            f"> {ENV_JSON} && chmod -R a+rX /opt/conveyor\n"
        )
        return build_image(
            engine, tag, context, containerfile, labels={"conveyor.swe.deps": ",".join(deps)}
        )


def ensure_task_image(engine: Engine, plan: TaskImage) -> BuiltImage:
    """The row's image (its test environment image first), built if missing."""
    if (found := stored_image(engine, plan.tag)) is not None:
        return found
    ensure_env_image(engine, plan.base_tag, plan.deps)
    with tempfile.TemporaryDirectory(prefix="conveyor-task-image-") as scratch:
        context = Path(scratch)
        shutil.copytree(plan.template, context / "testbed", symlinks=True)
        metadata = context / "metadata"
        if plan.metadata is not None:
            shutil.copytree(plan.metadata, metadata, symlinks=True)
        else:
            metadata.mkdir()
        containerfile = (
            f"FROM {plan.env_tag}\n"
            f"COPY testbed {TESTBED}\n"
            f"COPY metadata {METADATA}\n"
            f"WORKDIR {TESTBED}\n"
        )
        return build_image(
            engine,
            plan.tag,
            context,
            containerfile,
            labels={"conveyor.swe.instance": plan.instance_id},
        )


def ensure_row_image(
    row: SweRow, settings: RuntimeConfig, say: Callable[[str], None] | None = None
) -> tuple[str, BuiltImage | None]:
    """The row's image, built when missing (its base and environment layers first); a
    templated `runtime.image` is only looked up (None: it is there; `MissingImages`: not)."""
    engine = resolve_engine(settings.engine)
    if settings.image:
        image = templated_image(settings.image, row)
        if not image_exists(engine, image):
            raise MissingImages([(row.instance_id, image)], how_to_get(settings))
        return image, None
    base = ensure_base_image(engine, say=say)
    plan = plan_row(row, base.tag)
    return plan.tag, ensure_task_image(engine, plan)


@functools.lru_cache(maxsize=4096)
def _image_id(engine: Engine, image: str) -> str:
    done = engine.run("image", "inspect", "--format", "{{.Id}}", image)
    if done.returncode != 0:
        raise ImageBuildError(f"image {image} is missing: {done.stderr.strip()}")
    return done.stdout.strip()


@functools.cache
def _described(engine: Engine, image_id: str) -> tuple[str, tuple[str, ...]]:
    done = engine.run("run", "--rm", "--network", "none", image_id, "cat", ENV_JSON)
    if done.returncode != 0:
        raise ImageBuildError(
            f"{image_id} holds no {ENV_JSON} (not a Conveyor SWE image?): {done.stderr.strip()}"
        )
    info = json.loads(done.stdout)
    return info["site_packages"], tuple(info["top_level_modules"])


def image_environment(engine: Engine, image: str) -> TestEnvironment:
    """The test environment inside `image`, in the container's own paths: the venv, the
    grader's folder where the grader mounts it, the venv's site-packages and modules."""
    site, modules = _described(engine, _image_id(engine, image))
    return TestEnvironment(
        path=Path(VENV),
        plugin_dir=Path(GRADER),
        site_packages=Path(site),
        top_level_modules=modules,
    )
