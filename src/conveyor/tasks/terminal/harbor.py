"""Harbor task folders (the Terminal-Bench 2 layout), read natively, and where each can run.

A folder holds `task.toml` (timeouts in `[agent]` and `[verifier]`, verifier variables in
`[verifier].env`), `instruction.md` (what the agent is told), `environment/Dockerfile` (the
agent's starting machine), `tests/test.sh` (the verifier: it writes `/logs/verifier/reward.txt`,
or its exit status says pass/fail) and `solution/solve.sh` (the reference solution).

`plan_environment` reads the Dockerfile. A plain base (the host's Python `python:3.X[-slim]`,
`debian:*`, `ubuntu:*`) with only `COPY`, `WORKDIR` and `ENV` lines can run in bubblewrap over
the host's system: the copied files become the workspace, mounted at `WORKDIR`. Anything else
(`RUN`, another base, a compose file, a copy outside `WORKDIR`) needs docker; the plan says why.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

DEFAULT_AGENT_TIMEOUT_S = 600.0
DEFAULT_VERIFIER_TIMEOUT_S = 600.0
_INSTRUCTIONS = {"FROM", "COPY", "WORKDIR", "ENV"}
_OTHER_BASES = re.compile(r"^(debian|ubuntu):[\w.-]+$")


class HarborFormatError(ValueError):
    """A folder that is not a readable Harbor task (the message names the file and the problem)."""


@dataclass(frozen=True)
class EnvironmentPlan:
    """What the Dockerfile asks for: `copies` (source in the build context, absolute destination),
    `workdir`, `env`; `docker_reason` is None when bubblewrap can host it, else why not."""

    base: str = ""
    workdir: str = ""
    copies: tuple[tuple[str, str], ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    docker_reason: str | None = None


@dataclass(frozen=True)
class HarborTask:
    """One task folder, read: its name, instruction, timeouts and environment plan."""

    name: str
    path: Path
    instruction: str
    agent_timeout_s: float
    verifier_timeout_s: float
    verifier_env: dict[str, str]
    environment: EnvironmentPlan

    @property
    def tests_dir(self) -> Path:
        """The verifier's folder (copied in only after the rollout)."""
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        """The reference solution's folder."""
        return self.path / "solution"


def find_task_dirs(root: Path) -> list[Path]:
    """`root` itself when it is a task folder, else its task sub-folders, sorted by name."""
    root = Path(root)
    if not root.is_dir():
        raise HarborFormatError(f"{root}: not a folder")
    if (root / "task.toml").is_file():
        return [root]
    return sorted(p for p in root.iterdir() if (p / "task.toml").is_file())


def load_task(path: Path) -> HarborTask:
    """Read the folder at `path`; `HarborFormatError` when a required part is missing or bad."""
    path = Path(path).resolve()
    for required in ("task.toml", "instruction.md", "tests/test.sh"):
        if not (path / required).is_file():
            raise HarborFormatError(f"{path}: missing {required}")
    try:
        config = tomllib.loads((path / "task.toml").read_text())
    except tomllib.TOMLDecodeError as exc:
        raise HarborFormatError(f"{path / 'task.toml'}: {exc}") from None
    verifier = _section(config, "verifier", path)
    agent = _section(config, "agent", path)
    return HarborTask(
        name=path.name,
        path=path,
        instruction=(path / "instruction.md").read_text(),
        agent_timeout_s=_seconds(agent, DEFAULT_AGENT_TIMEOUT_S, path),
        verifier_timeout_s=_seconds(verifier, DEFAULT_VERIFIER_TIMEOUT_S, path),
        verifier_env={str(k): str(v) for k, v in dict(verifier.get("env", {})).items()},
        environment=plan_environment(path / "environment"),
    )


def _section(config: dict[str, Any], name: str, path: Path) -> dict[str, Any]:
    section = config.get(name, {})
    if not isinstance(section, dict):
        raise HarborFormatError(f"{path / 'task.toml'}: [{name}] must be a table")
    return section


def _seconds(section: dict[str, Any], default: float, path: Path) -> float:
    value = section.get("timeout_sec", default)
    if not isinstance(value, int | float) or value <= 0:
        raise HarborFormatError(f"{path / 'task.toml'}: timeout_sec must be a positive number")
    return float(value)


def host_python_base() -> str:
    """`python:3.X`, the image family whose interpreter matches the host's `/usr/bin/python3`."""
    name = os.path.basename(os.path.realpath("/usr/bin/python3"))
    match = re.fullmatch(r"python(3\.\d+)", name)
    return f"python:{match.group(1)}" if match else "python:(none on this host)"


def _plain_base(image: str) -> bool:
    python = host_python_base()
    variants = ("", "-slim", "-bookworm", "-slim-bookworm")
    return image in {python + v for v in variants} or _OTHER_BASES.match(image) is not None


def plan_environment(context: Path) -> EnvironmentPlan:
    """The `EnvironmentPlan` of an `environment/` folder (see the module doc)."""
    dockerfile = context / "Dockerfile"
    if (context / "docker-compose.yaml").exists() or (context / "docker-compose.yml").exists():
        return EnvironmentPlan(docker_reason="the environment is a docker-compose file")
    if not dockerfile.is_file():
        return EnvironmentPlan(docker_reason="environment/Dockerfile is missing")
    base, workdir = "", ""
    copies: list[tuple[str, str]] = []
    env: dict[str, str] = {}
    for keyword, rest in _instructions(dockerfile.read_text()):
        if keyword not in _INSTRUCTIONS:
            return EnvironmentPlan(docker_reason=f"the Dockerfile has a {keyword} instruction")
        if keyword == "FROM":
            if base or not _plain_base(rest):
                return EnvironmentPlan(docker_reason=f"base image {rest!r} is not a plain base")
            base = rest
        elif keyword == "WORKDIR":
            workdir = str(PurePosixPath(workdir or "/", rest))
        elif keyword == "ENV":
            env.update(_env_pairs(rest))
        else:
            parsed = _copy(rest, context, workdir)
            if isinstance(parsed, str):
                return EnvironmentPlan(docker_reason=parsed)
            copies += parsed
    if not workdir or workdir == "/":
        return EnvironmentPlan(docker_reason="no WORKDIR to mount the workspace at")
    outside = [dest for _, dest in copies if not _within(dest, workdir)]
    if outside:
        return EnvironmentPlan(docker_reason=f"COPY to {outside[0]}, outside WORKDIR {workdir}")
    return EnvironmentPlan(base=base, workdir=workdir, copies=tuple(copies), env=env)


def _instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = (pending + stripped).strip()
        pending = ""
        keyword, _, rest = full.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    if pending.strip():
        keyword, _, rest = pending.strip().partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def _env_pairs(rest: str) -> dict[str, str]:
    words = shlex.split(rest)
    if len(words) >= 2 and "=" not in words[0]:  # the legacy `ENV KEY value with spaces` form
        return {words[0]: " ".join(words[1:])}
    return dict(word.split("=", 1) for word in words if "=" in word)


def _copy(rest: str, context: Path, workdir: str) -> list[tuple[str, str]] | str:
    """The (source, destination) pairs of one COPY, or why bubblewrap cannot do it."""
    words = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
    flags = [w for w in words if w.startswith("--")]
    if any(not f.startswith("--chown=") and not f.startswith("--chmod=") for f in flags):
        return f"COPY {' '.join(flags)} needs docker"
    words = [w for w in words if not w.startswith("--")]
    if len(words) < 2:
        return f"COPY {rest!r} names no source or no destination"
    *sources, dest = words
    dest = str(PurePosixPath(workdir or "/", dest)) + ("/" if dest.endswith("/") else "")
    root = context.resolve()
    pairs: list[tuple[str, str]] = []
    for source in sources:
        matches = sorted(glob.glob(str(root / source))) or [str(root / source)]
        for match in matches:
            resolved = Path(match).resolve()
            if not resolved.is_relative_to(root) or not resolved.exists():
                return f"COPY source {source!r} is not in the build context"
            relative = str(resolved.relative_to(root))
            if resolved.is_file() and (dest.endswith("/") or len(matches) + len(sources) > 2):
                pairs.append((relative, str(PurePosixPath(dest, resolved.name))))
            else:
                pairs.append((relative, dest.rstrip("/") or "/"))
    return pairs


def _within(path: str, folder: str) -> bool:
    return PurePosixPath(path) == PurePosixPath(folder) or PurePosixPath(path).is_relative_to(
        folder
    )
