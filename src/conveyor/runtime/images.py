"""Container images built on this machine, without any registry: the base image.

`ensure_base_image(engine)` makes `conveyor-base:<hash>`: a minimal Debian root filesystem with
python3, made by Debian's `mmdebstrap` from the Debian archive (apt's own mirrors, no image
registry) and imported with `<engine> import`. The tag is a hash of the recipe (suite, variant,
packages, mirror, this module's recipe version), so the image is built once and every later
call, in this run or the next, finds it in the engine's own store; a changed recipe builds a new
one. Builds are serialised by a lock file, so concurrent runs or test workers build it once.
The root filesystem tarball is a temporary file, removed after the import.

The hash covers the recipe, not the archive's moving package versions: `--force` rebuilds.
Per-task images are layered on it with `FROM conveyor-base:<hash>`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from conveyor.models import cache_dir
from conveyor.runtime.engine import Engine

BASE_REPOSITORY = "conveyor-base"
# Bump when the way the image is made changes in a way the recipe's fields do not show.
RECIPE_VERSION = 1
DEFAULT_MIRROR = "http://deb.debian.org/debian"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_BUILD_TIMEOUT_S = 1800.0


class ImageBuildError(RuntimeError):
    """An image could not be built; the message holds the tool's own reason."""


@dataclass(frozen=True)
class BaseRecipe:
    """What the base image is made of; its hash is the image's tag."""

    suite: str = "bookworm"
    variant: str = "minbase"
    packages: tuple[str, ...] = ("python3",)
    mirror: str = DEFAULT_MIRROR
    version: int = RECIPE_VERSION

    @property
    def tag(self) -> str:
        """`conveyor-base:<16 hex digits of the recipe's hash>`."""
        text = json.dumps(asdict(self), sort_keys=True)
        return f"{BASE_REPOSITORY}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def default_recipe() -> BaseRecipe:
    """The recipe, with `$CONVEYOR_DEBIAN_MIRROR` as the mirror where it is set."""
    return BaseRecipe(mirror=os.environ.get("CONVEYOR_DEBIAN_MIRROR") or DEFAULT_MIRROR)


@dataclass(frozen=True)
class BuiltImage:
    """An image and how it came: `built` False when it was already there."""

    tag: str
    built: bool
    seconds: float
    size_bytes: int | None


def image_exists(engine: Engine, tag: str) -> bool:
    """Whether the engine's store holds `tag`."""
    return engine.run("image", "inspect", "--format", "{{.Id}}", tag).returncode == 0


def stored_image(engine: Engine, tag: str) -> BuiltImage | None:
    """`tag` as the store holds it (`built` False), or None when it is missing."""
    began = time.monotonic()
    if not image_exists(engine, tag):
        return None
    return BuiltImage(tag, False, time.monotonic() - began, image_size(engine, tag))


def image_size(engine: Engine, tag: str) -> int | None:
    """The image's size in bytes as the engine reports it, or None."""
    done = engine.run("image", "inspect", "--format", "{{.Size}}", tag)
    try:
        return int(done.stdout.strip()) if done.returncode == 0 else None
    except ValueError:
        return None


def _checked(argv: list[str], what: str, env: dict[str, str] | None = None) -> None:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S, check=False, env=env
        )
    except FileNotFoundError as exc:
        raise ImageBuildError(f"{what}: {argv[0]} is not installed") from exc
    except subprocess.TimeoutExpired as exc:
        raise ImageBuildError(f"{what} took longer than {_BUILD_TIMEOUT_S:g} s") from exc
    if done.returncode != 0:
        raise ImageBuildError(f"{what} failed: {(done.stderr or done.stdout).strip()[-2000:]}")


def build_rootfs(recipe: BaseRecipe, out: Path) -> None:
    """A root filesystem tarball of `recipe` at `out` (mmdebstrap, as root)."""
    if shutil.which("mmdebstrap") is None:
        raise ImageBuildError(
            "building the base image needs Debian's mmdebstrap (apt-get install mmdebstrap; "
            "scripts/bootstrap.sh installs it where it can)"
        )
    argv = ["mmdebstrap", "--quiet", f"--variant={recipe.variant}"]
    argv += [f"--include={','.join(recipe.packages)}"] if recipe.packages else []
    # No documentation, manual pages or locales: nothing in a sandbox reads them.
    argv += ["--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*"]
    argv += ["--dpkgopt=path-exclude=/usr/share/locale/*", "--dpkgopt=path-include=*/copyright"]
    argv += [recipe.suite, str(out), recipe.mirror]
    _checked(argv, f"mmdebstrap of {recipe.suite}")


def ensure_base_image(
    engine: Engine,
    recipe: BaseRecipe | None = None,
    *,
    force: bool = False,
    say: Callable[[str], None] | None = None,
) -> BuiltImage:
    """The base image of `recipe` in `engine`'s store, built if missing (see the module doc)."""
    recipe = recipe if recipe is not None else default_recipe()
    tag, began = recipe.tag, time.monotonic()
    if not force and image_exists(engine, tag):
        return BuiltImage(tag, False, time.monotonic() - began, image_size(engine, tag))
    lock_dir = cache_dir() / "containers"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / "base-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and image_exists(engine, tag):  # another process built it meanwhile
            return BuiltImage(tag, False, time.monotonic() - began, image_size(engine, tag))
        if say is not None:
            say(f"building {tag} ({recipe.suite} {recipe.variant} + {', '.join(recipe.packages)})")
        with tempfile.TemporaryDirectory(prefix="conveyor-rootfs-") as scratch:
            tarball = Path(scratch) / "rootfs.tar"
            build_rootfs(recipe, tarball)
            argv = engine.argv("import", "--change", f"ENV PATH={_PATH}")
            argv += ["--change", 'CMD ["/bin/bash"]', str(tarball), tag]
            _checked(argv, f"{engine.name} import", dict(engine.env) if engine.env else None)
    return BuiltImage(tag, True, time.monotonic() - began, image_size(engine, tag))


class MissingImages(ValueError):
    """Images a run needs that the engine's store does not hold; the message lists them and
    says how to get them."""

    def __init__(self, missing: list[tuple[str, str]], how: str) -> None:
        self.missing = missing
        shown = ", ".join(f"{task} ({tag})" for task, tag in missing[:20])
        more = f" and {len(missing) - 20} more" if len(missing) > 20 else ""
        super().__init__(f"{len(missing)} task images are missing: {shown}{more}; {how}")


def build_image(
    engine: Engine,
    tag: str,
    context: Path,
    containerfile: str,
    *,
    force: bool = False,
    labels: dict[str, str] | None = None,
) -> BuiltImage:
    """`tag` built from `containerfile` (its text) over the folder `context`, unless the store
    already holds it (`force`: build anyway). The build has no network (`--network none`):
    whatever it installs is in the context. Concurrent builders of one tag build it once (a
    lock file per tag). `ImageBuildError` with the engine's own reason."""
    began = time.monotonic()
    if not force and image_exists(engine, tag):
        return BuiltImage(tag, False, time.monotonic() - began, image_size(engine, tag))
    lock_dir = cache_dir() / "containers" / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(tag.encode()).hexdigest()[:16]
    with open(lock_dir / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and image_exists(engine, tag):
            return BuiltImage(tag, False, time.monotonic() - began, image_size(engine, tag))
        (context / "Containerfile").write_text(containerfile)
        argv = engine.argv("build", "-q", "--network", "none", "-f", "Containerfile", "-t", tag)
        for name, value in sorted((labels or {}).items()):
            argv += ["--label", f"{name}={value}"]
        env = dict(engine.env) if engine.env else None
        try:
            done = subprocess.run(
                [*argv, "."],
                cwd=context,
                capture_output=True,
                text=True,
                timeout=_BUILD_TIMEOUT_S,
                check=False,
                env=env,
            )
        except FileNotFoundError as exc:
            raise ImageBuildError(f"{engine.name} build: {engine.client} is not installed") from exc
        except subprocess.TimeoutExpired as exc:
            raise ImageBuildError(f"{engine.name} build of {tag} took too long") from exc
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip()[-2000:]
            raise ImageBuildError(f"{engine.name} build of {tag} failed: {why}")
    return BuiltImage(tag, True, time.monotonic() - began, image_size(engine, tag))
