"""Harbor task folders (the Terminal-Bench 2 layout), read natively, and where each can run.

A folder holds `task.toml` (timeouts in `[agent]` and `[verifier]`, verifier variables in
`[verifier].env`, the image build's limit in `[environment].build_timeout_sec`, network
policies in `[environment]`/`[verifier]` `network_mode` or the older `allow_internet`),
`instruction.md` (what the agent is told; leading canary comment lines are dropped, as Harbor
does), `environment/Dockerfile` (the agent's starting machine), `tests/test.sh` (the verifier:
it writes `/logs/verifier/reward.json` or `reward.txt`, or its exit status says pass/fail) and
`solution/solve.sh` (the reference solution). Defaults are Harbor's (`harbor` 0.25.0's
`TaskConfig`): 600 s for the verifier and the build, public network.

`network_fetches` lists the lines of the task's test scripts that fetch from the network
(package installs, downloads from a non-local URL): a verifier with such lines needs network,
which it gets only where `runtime.verifier_network` allows it (see `docker_env`).

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
DEFAULT_BUILD_TIMEOUT_S = 600.0
NETWORK_MODES = ("no-network", "public", "allowlist")
_CANARY_LINE = re.compile(r"^(<!--.*canary.*-->|#.*canary.*)$", re.IGNORECASE)
# A test-script line that fetches from the network: an installer of packages, or a download or
# clone of a URL whose host is not this machine.
_FETCH = re.compile(
    r"\b(apt(-get)?\s+(-\S+\s+)*(update|install)|pip3?\s+(-\S+\s+)*(install|download)"
    r"|uv\s+(pip\s+install|add|sync|tool\s+install|run\s+--with)|uvx\b|pipx\s+(install|run)"
    r"|npm\s+(install|ci|i)\b|npx\b|yarn\s+(add|install)|cargo\s+install|go\s+(get|install)"
    r"|gem\s+install|conda\s+install|apk\s+add)"
)
_URL = re.compile(r"\b(?:https?|ftp|git)://([^/\s:'\"]+)")
_LOCAL_HOSTS = {"localhost", "127.0.0.1", "0.0.0.0", "[::1]", "::1"}
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
    build_timeout_s: float = DEFAULT_BUILD_TIMEOUT_S
    verifier_network_mode: str = "public"
    network_fetches: tuple[str, ...] = ()

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
    environment = _section(config, "environment", path)
    return HarborTask(
        name=path.name,
        path=path,
        instruction=strip_canary((path / "instruction.md").read_text()),
        agent_timeout_s=_seconds(agent, DEFAULT_AGENT_TIMEOUT_S, path),
        verifier_timeout_s=_seconds(verifier, DEFAULT_VERIFIER_TIMEOUT_S, path),
        verifier_env={str(k): str(v) for k, v in dict(verifier.get("env", {})).items()},
        environment=plan_environment(path / "environment"),
        build_timeout_s=_seconds(
            environment, DEFAULT_BUILD_TIMEOUT_S, path, key="build_timeout_sec"
        ),
        verifier_network_mode=_network_mode(verifier, environment, path),
        network_fetches=network_fetches(path / "tests"),
    )


def strip_canary(text: str) -> str:
    """`text` without its leading canary comment lines (and the blank lines after them)."""
    lines = text.split("\n")
    at = 0
    while at < len(lines) and _CANARY_LINE.match(lines[at].strip()):
        at += 1
    while at < len(lines) and not lines[at].strip():
        at += 1
    return "\n".join(lines[at:])


def _network_mode(verifier: dict[str, Any], environment: dict[str, Any], path: Path) -> str:
    """The verifier's network policy, as Harbor resolves it: `[verifier].network_mode` where
    set, else the baseline of the verifier's environment (`[verifier.environment]` where the
    task gives it one of its own, else `[environment]`): its `network_mode`, or the older
    `allow_internet`, else public."""
    mode = verifier.get("network_mode")
    if mode is None:
        nested = verifier.get("environment")
        base = nested if isinstance(nested, dict) else environment
        mode = base.get("network_mode")
        allow = base.get("allow_internet")
        if mode is None and isinstance(allow, bool):
            mode = "public" if allow else "no-network"
    mode = "public" if mode is None else mode
    if mode not in NETWORK_MODES:
        raise HarborFormatError(
            f"{path / 'task.toml'}: network_mode {mode!r} is not one of {', '.join(NETWORK_MODES)}"
        )
    return str(mode)


def network_fetches(tests: Path) -> tuple[str, ...]:
    """`file:line: text` of each line of the shell scripts under `tests` that fetches from the
    network (see the module doc); comments are skipped."""
    found: list[str] = []
    scripts = sorted(p for p in tests.rglob("*.sh") if p.is_file()) if tests.is_dir() else []
    for script in scripts:
        for number, line in enumerate(script.read_text(errors="replace").splitlines(), 1):
            code = line.strip()
            if not code or code.startswith("#"):
                continue
            hosts = {h.lower() for h in _URL.findall(code)}
            if _FETCH.search(code) or hosts - _LOCAL_HOSTS:
                found.append(f"{script.relative_to(tests.parent)}:{number}: {code[:200]}")
    return tuple(found)


def _section(config: dict[str, Any], name: str, path: Path) -> dict[str, Any]:
    section = config.get(name, {})
    if not isinstance(section, dict):
        raise HarborFormatError(f"{path / 'task.toml'}: [{name}] must be a table")
    return section


def _seconds(
    section: dict[str, Any], default: float, path: Path, key: str = "timeout_sec"
) -> float:
    value = section.get(key, default)
    if not isinstance(value, int | float) or value <= 0:
        raise HarborFormatError(f"{path / 'task.toml'}: {key} must be a positive number")
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
