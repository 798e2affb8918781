"""Running a Harbor task in a container of its own image, on podman or docker.

`DockerTaskRuntime` builds the task's `environment/` into an image and runs one container of
it per rollout with `conveyor.runtime.docker.DockerRuntime` (no network, no capabilities,
limits). No image registry is used: each `FROM` of the Dockerfile that names an image in
`base_images` (`tasks.options.terminal.base_images`) is rewritten to the local image it maps
to before the build (the task folder itself is never changed; the rewritten Dockerfile is
passed with `-f`). `conveyor-base` stands for the base image `conveyor images base` builds
(Debian bookworm with its Python 3.11: what `python:3.11-slim` and `debian:bookworm` give);
the defaults map those names to it. A base neither mapped nor in the engine's store is refused
when the family is built (`unresolved_base`), naming the option. The image's tag is a hash of
the rewritten Dockerfile and the build context, so a rebuild happens only when they change; a
build runs under the task's `[environment].build_timeout_sec`.

`verify` grades after the rollout, in a new container over the same files, as the bubblewrap
verifier does over the same workspace: every process the agent left is killed (`kill -9 -1`),
the container is committed to an image (`<tag>-verify:<container>`, removed after), and a
container of it runs `bash /tests/test.sh` as its main process (so a test that kills every
other process, as ours do, kills none of its own ancestors) under the verifier timeout, with
`[verifier].env`, the same limits, the task's `tests/` copied to a host folder mounted
read-only at `/tests` and a new empty host folder at `/logs`. The reward is read on this host
from `/logs/verifier/reward.json` or `reward.txt` (`sandbox.read_reward`: never through a
symbolic link); a verifier killed by a signal or timed out scores 0; the engine failing to run
it (exit 125) is a `RuntimeFailure`. Files the agent wrote in the `/tmp` tmpfs do not carry
over (a commit holds the container's own file system only).

The verifier's network: off, like the agent's, unless `runtime.verifier_network` is true and
the task's own policy is not `no-network`; then its container is on the engine's default
network with the engine's default capabilities (Harbor's docker runs verifiers so, and published
ones `apt-get install` their tools, which needs chown and setuid; `no-new-privileges` stays).
Without network, a verifier that gives less than the full reward and comes from test scripts
that fetch from the network is an infrastructure error (`RuntimeFailure`) naming the reason,
never a reward of 0; with it, one is where a host those scripts fetch from does not answer this
host's own probe (`sandbox.network_failure`). The verifier's output never decides it: it carries
the policy's code's output, which could fake a failed fetch.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from conveyor.runtime.base import RuntimeFailure
from conveyor.runtime.docker import DockerRuntime, container_spec
from conveyor.runtime.engine import Engine, owner_labels
from conveyor.runtime.images import (
    BASE_REPOSITORY,
    ImageBuildError,
    default_recipe,
    ensure_base_image,
    image_exists,
)
from conveyor.runtime.limits import SandboxLimits
from conveyor.tasks.terminal.harbor import HarborTask
from conveyor.tasks.terminal.sandbox import (
    KILLED,
    REWARD_FILE,
    VerifierResult,
    cache_root,
    network_failure,
    read_reward,
)

# What podman / docker `run` exits with when the engine, not the command, failed.
_ENGINE_ERRORS = (125, 126, 127)
_ENGINE_SAYS = re.compile(r"^(Error: |docker: )", re.MULTILINE)
LOCAL_BASE = BASE_REPOSITORY
# Registry images whose content the local base image gives (bookworm, its python3 is 3.11).
DEFAULT_BASE_IMAGES: dict[str, str] = {
    name: LOCAL_BASE
    for name in (
        "python:3.11",
        "python:3.11-slim",
        "python:3.11-bookworm",
        "python:3.11-slim-bookworm",
        "debian:bookworm",
        "debian:bookworm-slim",
        "debian:12",
        "debian:12-slim",
    )
}
_FROM = re.compile(r"^(\s*FROM\s+)((?:--\S+\s+)*)(\S+)(.*)$", re.IGNORECASE)


def dockerfile_bases(text: str) -> list[str]:
    """The images the Dockerfile's `FROM` lines name (stages named by an earlier `AS` left
    out)."""
    stages: set[str] = set()
    bases: list[str] = []
    for line in text.splitlines():
        match = _FROM.match(line)
        if match is None:
            continue
        image, rest = match.group(3), match.group(4).split()
        if image.lower() not in stages and image not in bases:
            bases.append(image)
        if len(rest) >= 2 and rest[0].upper() == "AS":
            stages.add(rest[1].lower())
    return bases


def local_image(name: str) -> str:
    """The image `name` (a `base_images` value) is: `conveyor-base` is the local base image's
    tag (by its recipe; `ensure_base_image` builds it)."""
    return default_recipe().tag if name == LOCAL_BASE else name


def mapped_dockerfile(text: str, base_images: Mapping[str, str]) -> str:
    """The Dockerfile with each `FROM` image found in `base_images` replaced by its local
    image."""
    out = []
    for line in text.splitlines():
        match = _FROM.match(line)
        if match is not None and match.group(3) in base_images:
            image = local_image(base_images[match.group(3)])
            line = f"{match.group(1)}{match.group(2)}{image}{match.group(4)}"
        out.append(line)
    return "\n".join(out) + "\n"


def unresolved_base(task: HarborTask, base_images: Mapping[str, str], engine: Engine) -> str | None:
    """Why the task's image cannot be built here, or None: a `FROM` image that `base_images`
    does not map and the engine's store does not hold (no registry is used)."""
    dockerfile = task.path / "environment" / "Dockerfile"
    if not dockerfile.is_file():
        return "environment/Dockerfile is missing"
    for base in dockerfile_bases(dockerfile.read_text()):
        if base in base_images:
            target = base_images[base]
            if target != LOCAL_BASE and not image_exists(engine, target):
                return f"base image {base!r} maps to {target!r}, which {engine.name} does not hold"
        elif not image_exists(engine, base):
            return (
                f"its Dockerfile's base image {base!r} is not in {engine.name}'s store and no "
                "registry is used: build or load it locally, or map it to a local image with "
                f"tasks.options.terminal.base_images: {{{base!r}: IMAGE}} "
                f"({LOCAL_BASE!r}: the base image of `conveyor images base`)"
            )
    return None


def image_tag(task: HarborTask, dockerfile: str | None = None) -> str:
    """`conveyor-terminal-<name>:<hash of the (rewritten) Dockerfile and environment/>`."""
    digest = hashlib.sha256((dockerfile or "").encode() + b"\0")
    context = task.path / "environment"
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(context)).encode() + b"\0" + path.read_bytes())
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in task.name.lower())
    return f"conveyor-terminal-{name}:{digest.hexdigest()[:16]}"


def dockerfile_workdir(task: HarborTask) -> str:
    """The last `WORKDIR` of the task's Dockerfile (`/` when it sets none)."""
    workdir = "/"
    dockerfile = task.path / "environment" / "Dockerfile"
    for line in dockerfile.read_text().splitlines() if dockerfile.is_file() else []:
        words = line.strip().split(None, 1)
        if len(words) == 2 and words[0].upper() == "WORKDIR":
            workdir = str(PurePosixPath(workdir, words[1].strip()))
    return workdir


class DockerTaskRuntime(DockerRuntime):
    """A container of the task's image; `start` builds the image first (see the module doc)."""

    def __init__(
        self,
        task: HarborTask,
        *,
        limits: SandboxLimits | None,
        docker: str | Engine,
        base_images: Mapping[str, str] | None = None,
        verifier_network: bool = False,
    ) -> None:
        dockerfile = task.path / "environment" / "Dockerfile"
        self.base_images = dict(DEFAULT_BASE_IMAGES if base_images is None else base_images)
        self.dockerfile = mapped_dockerfile(dockerfile.read_text(), self.base_images)
        super().__init__(
            image_tag(task, self.dockerfile),
            limits=limits,
            workdir=dockerfile_workdir(task),
            docker=docker,
        )
        self.task = task
        self.verifier_network = verifier_network
        _drop_option(self.spec, "--workdir")  # the image's own (see `_drop_option`)

    async def start(self) -> None:
        """Build the image (unless the engine holds it), then start the container."""
        await self.ensure_image()
        await super().start()

    async def ensure_image(self) -> bool:
        """Build the task's image unless the engine holds it; whether it was built
        (`conveyor images build` calls it ahead of a run)."""
        if await asyncio.to_thread(image_exists, self.engine, self.image):
            return False
        await self._build()
        return True

    async def _build(self) -> None:
        if LOCAL_BASE in self.base_images.values():
            try:
                await asyncio.to_thread(ensure_base_image, self.engine)
            except ImageBuildError as exc:
                raise RuntimeFailure(f"the base image cannot be built: {exc}") from exc
        context = self.task.path / "environment"
        with tempfile.TemporaryDirectory(prefix="conveyor-dockerfile-") as scratch:
            dockerfile = Path(scratch) / "Dockerfile"
            dockerfile.write_text(self.dockerfile)
            argv = [self.docker, "build", "-q", "-f", str(dockerfile), "-t", self.image]
            built = await self._client([*argv, str(context)], timeout_s=self.task.build_timeout_s)
        if built.timed_out:
            raise RuntimeFailure(
                f"{self.engine.name} build of {self.task.name} took longer than its "
                f"build_timeout_sec ({self.task.build_timeout_s:g} s)"
            )
        if built.exit_code != 0:
            raise RuntimeFailure(
                f"{self.engine.name} build of {self.task.name} failed: "
                f"{built.stderr.strip()[-2000:]}"
            )

    @property
    def network_allowed(self) -> bool:
        """Whether the verifier gets network: `runtime.verifier_network` and a task policy
        other than `no-network`."""
        return self.verifier_network and self.task.verifier_network_mode != "no-network"

    async def verify(self) -> VerifierResult:
        """Grade the container's state with the task's tests (see the module doc)."""
        await self.exec("kill -9 -1 2>/dev/null; true", 30)  # its own shell dies too: no check
        tag = f"{self.image.partition(':')[0]}-verify:{self.name.removeprefix('conveyor-')}"
        committed = await self._client([self.docker, "commit", "-q", self.name, tag], timeout_s=600)
        if committed.exit_code != 0:
            raise RuntimeFailure(f"committing {self.name} failed: {committed.stderr.strip()}")
        try:
            result = await self._run_tests(tag)
        finally:
            await self._client([self.docker, "rmi", "-f", tag], timeout_s=120)
        reason = await asyncio.to_thread(
            network_failure, self.task, result, network=self.network_allowed
        )
        if reason is not None:
            if self.network_allowed:
                raise RuntimeFailure(
                    f"the verifier of {self.task.name} failed to reach the network: {reason}"
                )
            raise RuntimeFailure(
                f"the verifier of {self.task.name} needs network, and "
                f"runtime.verifier_network is off: {reason}"
            )
        return result

    async def _run_tests(self, image: str) -> VerifierResult:
        """`bash /tests/test.sh` as the main process of a new container of `image`: the tests
        and an empty `/logs` are host folders mounted in, the reward is read on this host."""
        scratch = Path(tempfile.mkdtemp(prefix="verify-", dir=cache_root()))
        try:
            tests, logs = scratch / "tests", scratch / "logs"
            shutil.copytree(self.task.tests_dir, tests, symlinks=False)
            (logs / "verifier").mkdir(parents=True)
            for folder in (logs, logs / "verifier"):
                folder.chmod(0o777)  # the image's user may be any
            for path in [tests, *tests.rglob("*")]:
                path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
            name = f"{self.name}-verify"
            argv = container_spec(
                image,
                name=name,
                limits=self.limits,
                workdir=self.root,
                env=self.task.verifier_env,
                docker=self.docker,
                labels=owner_labels(),
            )
            argv[argv.index("-d")] = "--rm"
            _drop_option(argv, "--workdir")
            if self.network_allowed:
                # The engine's default network and capabilities, as Harbor's docker gives its
                # verifiers: published ones install their tools (apt needs chown and setuid).
                _drop_option(argv, "--network")
                _drop_option(argv, "--cap-drop")
            mounts = [
                "--mount", f"type=bind,source={tests},target=/tests,readonly",
                "--mount", f"type=bind,source={logs},target=/logs",
            ]  # fmt: skip
            argv = [*argv[:-4], *mounts, image, "bash", "/tests/test.sh"]
            try:
                result = await self._client(
                    argv,
                    timeout_s=self.task.verifier_timeout_s,
                    output_bytes=self.limits.output_bytes,
                )
            except BaseException:
                await self._client([self.docker, "rm", "-f", "-v", name], timeout_s=60)
                raise
            if result.timed_out:  # the client was killed; its container still runs
                await self._client([self.docker, "rm", "-f", "-v", name], timeout_s=60)
            output = (result.stdout + result.stderr)[-4000:]
            if result.timed_out:
                return VerifierResult(0.0, "timeout", result.exit_code, output)
            if result.exit_code >= KILLED or result.exit_code < 0:
                # Killed by a signal (code it ran may kill it after writing a reward): no verdict.
                return VerifierResult(0.0, "killed", result.exit_code, output)
            if result.exit_code == 125 or (
                result.exit_code in _ENGINE_ERRORS and _ENGINE_SAYS.search(result.stderr)
            ):
                raise RuntimeFailure(
                    f"{self.engine.name} could not run the verifier of {self.task.name}: "
                    f"{result.stderr.strip()[-1000:]}"
                )
            return read_reward(logs / REWARD_FILE, result.exit_code, output)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def _drop_option(argv: list[str], option: str) -> None:
    """Remove `option` and its value from `argv`. Without `--workdir` a container starts in
    its image's `WORKDIR`, which podman creates where the image lacks it (a Dockerfile whose
    last line is `WORKDIR /app` builds no `/app` with buildah), while an explicit `--workdir`
    must exist."""
    at = argv.index(option)
    del argv[at : at + 2]
