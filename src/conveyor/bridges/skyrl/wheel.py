"""The pinned SkyRL wheel, fetched once into the cache, and its source read without installing it.

`pip download --python-version 3.12 --only-binary=:all:` works from Python 3.11, where
`pip install skyrl==0.4.0` does not (SkyRL requires Python >= 3.12), so the bridge can read
SkyRL's own types and validation here (`conveyor.bridges.skyrl.validation`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from conveyor.bridges.report import BridgeUnavailable
from conveyor.bridges.skyrl.validation import SkyrlSource, parse_sources

SKYRL_VERSION = "0.4.0"
WHEEL_CACHE = Path.home() / ".cache" / "conveyor" / "wheels"


def wheel_cache() -> Path:
    """Where wheels are cached: `CONVEYOR_WHEEL_CACHE`, else ~/.cache/conveyor/wheels."""
    return Path(os.environ.get("CONVEYOR_WHEEL_CACHE", WHEEL_CACHE))


def cached_wheel(cache: Path | None = None) -> Path | None:
    """The pinned wheel if it is already in the cache."""
    found = sorted((cache or wheel_cache()).glob(f"skyrl-{SKYRL_VERSION}-*.whl"))
    return found[0] if found else None


def pinned_wheel(cache: Path | None = None) -> Path:
    """The pinned wheel, downloaded into the cache on first use (`BridgeUnavailable` when
    PyPI cannot be reached: the message is pip's)."""
    folder = cache or wheel_cache()
    wheel = cached_wheel(folder)
    if wheel is not None:
        return wheel
    folder.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        f"skyrl=={SKYRL_VERSION}",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--quiet",
        "-d",
        str(folder),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    except subprocess.TimeoutExpired:
        raise BridgeUnavailable(
            f"downloading skyrl=={SKYRL_VERSION} took over 300 s; is PyPI reachable?"
        ) from None
    wheel = cached_wheel(folder)
    if done.returncode != 0 or wheel is None:
        raise BridgeUnavailable(
            f"cannot download skyrl=={SKYRL_VERSION} (needed to read SkyRL's types): "
            f"{done.stderr.strip()[-800:] or 'pip saved no wheel'}"
        )
    return wheel


def parse_wheel(wheel: Path) -> SkyrlSource:
    """SkyRL's batch TypedDicts and validation source, read from the wheel file."""
    with zipfile.ZipFile(wheel) as archive:
        return parse_sources(lambda path: archive.read(path).decode())
