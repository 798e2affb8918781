"""A vLLM server that training can reach: weights go by broadcast or to disk, then reload.

`VLLMServerEngine` samples like `OpenAICompatibleClient` and is also a `WeightReceiver`:
`update_weights` writes the trainer's tensors as safetensors (with the model's `config.json`)
to `weights_dir/v{N}` (a temporary folder renamed into place, so a half-written version never
exists), then asks the server to load that folder and to drop its cached prefixes:

    POST {root}/collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": ".../vN"}}
    POST {root}/reset_prefix_cache

`{root}` is the server's root (`http://host:port`, the base URL without `/v1`): vLLM mounts
these development endpoints there, and only with `VLLM_SERVER_DEV_MODE=1`. `reload_weights`
(vLLM 0.32, `model_loader/reload/inplace.py`) points the model config at `weights_path` and
re-runs the model's weight loading from that folder's `*.safetensors` in place, CPU GEMM
re-packing included, so the folder must be readable by the server at the same path (same
machine or a shared filesystem). Old versions are deleted, keeping the newest `keep_versions`.

With `weight_sync` 'collective' (or 'auto' on a server started with the worker extension) the
weights go by broadcast instead of a folder: the server's workers join a process group with
this client at the first sync and receive every later update through it
(`conveyor.engines.weight_group`; the file path stays the fallback).

`weight_fingerprint` asks the server for the prompt logprobs of the probe sequence (temperature
1, as served); the weights themselves are opaque over HTTP, so it has no digests.

`check_trainable` is the start-up probe for training: it names, in one `EngineError`, everything
the server lacks (token ids, prompt logprobs, the development endpoints, processed logprobs).
Evaluation needs none of these and never calls it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.engines.base import EngineError, SampleRequest, WeightFingerprint
from conveyor.engines.openai_http import OpenAICompatibleClient, parse_completion
from conveyor.engines.vllm_local import version_salt
from conveyor.engines.weight_group import (
    DEFAULT_BUCKET_MB,
    WORKER_EXTENSION,
    WeightSender,
    WeightSyncMode,
    local_address_towards,
)

if TYPE_CHECKING:
    from torch import Tensor

# Tries (and the pause between them) to reset the prefix cache: vLLM refuses while running
# requests hold cached blocks, and says to retry.
_RESET_TRIES = 20
_RESET_PAUSE_S = 0.1
# Files of the model folder copied next to each weights version (small; the loader reads none
# of them, but a version folder is then a loadable model for inspection).
_CONFIG_FILES = ("config.json", "generation_config.json")
# The start-up probe's prompt (ids valid in any vocabulary) and the temperature at which raw
# and processed logprobs differ (at temperature 1 they are the same).
_PROBE_PROMPT = [1, 2, 3]
_PROBE_TEMPERATURE = 2.0
_DEV_MODE_HINT = (
    "start it with VLLM_SERVER_DEV_MODE=1 `python -m vllm.entrypoints.openai.api_server "
    "--logprobs-mode processed_logprobs ...` (vLLM >= 0.32), or use engine.kind 'vllm'; "
    "evaluation works without these"
)


class VLLMServerEngine(OpenAICompatibleClient):
    """`SamplingClient` and `WeightReceiver` over a vLLM server in development mode.

    `weights_dir` holds the weight versions the server loads (None: a temporary folder, removed
    at `close`); `source_dir` the model folder whose config files go with them; `keep_versions`
    how many versions stay on disk; `server_root` where the development endpoints are (default:
    `base_url` without its `/v1`). Other arguments are `OpenAICompatibleClient`'s.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        weights_dir: Path | None = None,
        source_dir: Path | None = None,
        keep_versions: int = 2,
        server_root: str | None = None,
        weight_sync: WeightSyncMode = "auto",
        weight_bucket_mb: float = DEFAULT_BUCKET_MB,
        **options: Any,
    ) -> None:
        super().__init__(base_url, model, **options)
        if keep_versions < 1:
            raise ValueError(f"VLLMServerEngine: keep_versions must be >= 1, got {keep_versions}")
        if weight_sync not in ("auto", "collective", "safetensors"):
            raise ValueError(
                f"weight_sync must be 'auto', 'collective' or 'safetensors', not {weight_sync!r}"
            )
        # 'auto' tries the weight group at the first sync and keeps to safetensors for good
        # if the server's workers lack the extension; `weight_sync_used` says what the last
        # sync went by
        self.weight_sync: WeightSyncMode = weight_sync
        self.weight_sync_used = ""
        self.weights_dir = weights_dir
        self.source_dir = source_dir
        self.keep_versions = keep_versions
        self.server_root = (server_root or self.base_url.removesuffix("/v1")).rstrip("/")
        self.prefix_resets_refused = 0  # syncs after which the server kept its cached prefixes
        self._own_dir: Path | None = None
        # its host (this machine's address towards the server) is found when a group opens: a
        # server name that does not resolve yet must not stop the engine from being built
        self._sender = WeightSender(bucket_mb=weight_bucket_mb)
        self._group_dtype = ""

    @property
    def policy_version(self) -> int:
        """The `version` of the last `update_weights` (0 before any)."""
        return self._version

    def use_weights_dir(self, path: Path) -> None:
        """Write weight versions under `path` from now on (`conveyor train`: `RUN/weights`)."""
        self.weights_dir = Path(path)

    def payload(self, request: SampleRequest) -> dict[str, Any]:
        """The completion body, salted with the policy version (`version_salt`): the server
        reuses a cached prefix only for requests of the same weights."""
        return {**super().payload(request), "cache_salt": version_salt(self._version)}

    async def update_weights(
        self, weights: Iterable[tuple[str, Tensor]], version: int | None = None
    ) -> float:
        """Load `weights` into the server and reset its prefix cache; returns the seconds taken.

        By collectives (`weight_sync` 'collective', or 'auto' on a server whose workers have
        the extension: `conveyor.engines.weight_group`) or through a safetensors folder under
        `weights_dir/v{version}` that the server reloads. An `EngineError` if the server
        refuses."""
        start = time.perf_counter()
        new_version = self._version + 1 if version is None else version
        if self.weight_sync != "safetensors" and await self._group_ready():
            await self._broadcast(weights)
            self.weight_sync_used = "collective"
        else:
            folder = await asyncio.to_thread(self._write_version, weights, new_version)
            answer = await self._post(
                {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}},
                f"{self.server_root}/collective_rpc",
            )
            if "results" not in answer:
                raise EngineError(f"{self.server_root}/collective_rpc: unexpected answer {answer}")
            self.weight_sync_used = "safetensors"
        self._version = new_version
        await self._reset_prefix_cache()
        if self.weight_sync_used == "safetensors":
            await asyncio.to_thread(self._prune, new_version)
        return time.perf_counter() - start

    async def _rpc(self, method: str, kwargs: dict[str, Any], timeout_s: float) -> list[Any]:
        """One `/collective_rpc` call, never retried (a resent receive would wait for
        broadcasts that never come); the per-worker results."""
        import httpx

        url = f"{self.server_root}/collective_rpc"
        try:
            response = await self._client().post(
                url, json={"method": method, "kwargs": kwargs}, timeout=timeout_s
            )
        except httpx.HTTPError as exc:
            raise EngineError(f"{url} ({method}): {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise EngineError(
                f"{url} ({method}): HTTP {response.status_code}: {response.text[:300]}"
            )
        results = response.json().get("results") if response.content else None
        return list(results) if isinstance(results, list) else []

    async def _group_ready(self) -> bool:
        """Whether this sync can go by collectives: the group is open, or opens now. 'auto'
        falls back to safetensors (for good) when the workers lack the extension; 'collective'
        raises an `EngineError` naming the flag the server needs."""
        if self._sender.connected:
            return True
        try:
            # also counts the workers: one result each (the extension's leave is harmless)
            workers = len(await self._rpc("conveyor_leave_weight_group", {}, 30.0))
        except EngineError as exc:
            if self.weight_sync == "auto":
                self.weight_sync = "safetensors"
                return False
            raise EngineError(
                f"engine.weight_sync 'collective': the server at {self.base_url} cannot join a "
                f"weight group ({exc}); start it with --worker-extension-cls {WORKER_EXTENSION} "
                "(conveyor importable there), or set engine.weight_sync to 'auto' or 'safetensors'"
            ) from exc
        try:
            self._sender.host = await asyncio.to_thread(local_address_towards, self.server_root)
        except OSError as exc:
            raise EngineError(f"no route from this machine to {self.server_root}: {exc}") from exc
        spec = self._sender.open(max(1, workers))
        try:
            _, joined = await asyncio.gather(
                asyncio.to_thread(self._sender.connect),
                self._rpc("conveyor_join_weight_group", {"spec": spec.to_json()}, spec.timeout_s),
            )
        except BaseException:
            self._sender.close()
            raise
        self._group_dtype = str(joined[0]) if joined else "float32"
        return True

    async def _broadcast(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        """Send one update through the open group while the server receives it."""
        named = list(weights)
        if not named:
            raise EngineError("update_weights got no tensors")
        dtype = self._group_dtype
        plan = self._sender.plan(named, dtype)
        sending = asyncio.ensure_future(asyncio.to_thread(self._sender.send, named, plan, dtype))
        try:
            await self._rpc(
                "conveyor_receive_weights",
                {"plan": json.dumps(plan), "dtype": dtype},
                self._sender.timeout_s,
            )
            await sending
        except BaseException as exc:
            self._sender.close()  # the next sync opens a new group
            await asyncio.gather(sending, return_exceptions=True)
            if isinstance(exc, Exception) and not isinstance(exc, EngineError):
                raise EngineError(f"collective weight sync failed: {exc!r}") from exc
            raise

    async def _reset_prefix_cache(self) -> None:
        for _ in range(_RESET_TRIES):
            answer = await self._post({}, f"{self.server_root}/reset_prefix_cache")
            if answer.get("success", True):
                return
            await asyncio.sleep(_RESET_PAUSE_S)
        # Running requests held their blocks throughout: the old weights' cached prefixes stay
        # until evicted, never reused (requests are salted with their version). Counted.
        self.prefix_resets_refused += 1

    def _root(self) -> Path:
        if self.weights_dir is not None:
            return self.weights_dir
        if self._own_dir is None:
            self._own_dir = Path(tempfile.mkdtemp(prefix="conveyor-weights-"))
        return self._own_dir

    def _write_version(self, weights: Iterable[tuple[str, Tensor]], version: int) -> Path:
        from safetensors.torch import save_file

        root = self._root()
        root.mkdir(parents=True, exist_ok=True)
        target = root / f"v{version}"
        tmp = root / f".tmp-v{version}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        # Cloned: tied tensors (embedding and lm_head) share storage, which safetensors refuses.
        tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in weights}
        if not tensors:
            raise EngineError("update_weights got no tensors")
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        for name in _CONFIG_FILES:
            if self.source_dir is not None and (self.source_dir / name).is_file():
                shutil.copy2(self.source_dir / name, tmp / name)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        return target

    def _prune(self, current: int) -> None:
        """Delete all versions but `current` and the newest others, `keep_versions` in all (by
        number: after a resume that went back, the newer versions of the old run go first)."""
        others = sorted(
            int(p.name[1:])
            for p in self._root().glob("v*")
            if p.is_dir() and p.name[1:].isdigit() and int(p.name[1:]) != current
        )
        keep = (
            set(others[len(others) - (self.keep_versions - 1) :])
            if self.keep_versions > 1
            else set()
        )
        for number in others:
            if number not in keep:
                shutil.rmtree(self._root() / f"v{number}", ignore_errors=True)

    async def weight_fingerprint(self, probe_ids: Sequence[int]) -> WeightFingerprint:
        """The server's temperature-1 prompt logprobs of `probe_ids` (no digests: the weights
        are opaque over HTTP), tagged with `policy_version`."""
        if len(probe_ids) < 2:
            raise ValueError("a weight probe needs at least two tokens")
        probe = list(probe_ids)
        data = await self._post(self._prompt_logprobs_body(probe))
        return WeightFingerprint(
            policy_version=self._version, probe_logprobs=_prompt_logprobs(data, probe)
        )

    def _prompt_logprobs_body(self, prompt: list[int]) -> dict[str, Any]:
        return {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,
            "return_token_ids": True,
        }

    async def check_trainable(self) -> None:
        """At start of training: return if the server can be trained through; otherwise one
        `EngineError` naming everything it lacks. Harmless to the server: one short sample,
        one prompt scoring, a `/collective_rpc` without a method (refused before any call) and
        a reset of the (still empty) prefix cache."""
        import httpx

        problems: list[str] = []
        request = SampleRequest(
            prompt_ids=_PROBE_PROMPT, max_tokens=1, temperature=_PROBE_TEMPERATURE, seed=0
        )
        try:
            result = parse_completion(await self._post(self.payload(request)))
        except EngineError as exc:
            problems.append(f"it does not sample by token ids with logprobs ({exc})")
        else:
            scored = [*_PROBE_PROMPT, *result.token_ids]
            try:
                served = _prompt_logprobs(
                    await self._post(self._prompt_logprobs_body(scored)), scored
                )
            except EngineError as exc:
                problems.append(f"it does not score prompts (prompt_logprobs: {exc})")
            else:
                # Raw logprobs ignore the sampling temperature: the behaviour logprobs would not
                # be those of the distribution sampled from. (A near-certain token cannot tell.)
                at_one = served[-1]
                if abs(at_one) > 1e-3 and abs(result.logprobs[0] - at_one) < 1e-5:
                    problems.append(
                        "it reports raw logprobs (temperature 1 whatever the sampling "
                        "temperature), not the processed logprobs training needs"
                    )
        for path, expected in (
            ("/collective_rpc", 400),  # exists: it refuses a call without a method
            ("/reset_prefix_cache", 200),
        ):
            url = f"{self.server_root}{path}"
            try:
                response = await self._client().post(url, json={})
                status = response.status_code
            except httpx.HTTPError as exc:
                problems.append(f"{path} cannot be reached ({type(exc).__name__})")
                continue
            if status != expected:
                problems.append(f"{path} answers HTTP {status}")
        if problems:
            raise EngineError(
                f"the server at {self.base_url} cannot be trained through: "
                + "; ".join(problems)
                + f"; {_DEV_MODE_HINT}"
            )

    async def close(self) -> None:
        """Close the connections; a temporary weights folder is removed."""
        await super().close()
        self._sender.close()
        own, self._own_dir = self._own_dir, None
        if own is not None:
            shutil.rmtree(own, ignore_errors=True)


def _prompt_logprobs(data: dict[str, Any], prompt: list[int]) -> list[float]:
    """The logprob of each prompt token given its prefix (0.0 at position 0) from a completions
    answer with `prompt_logprobs`."""
    try:
        positions = data["choices"][0].get("prompt_logprobs") or data.get("prompt_logprobs")
        if not isinstance(positions, list) or len(positions) != len(prompt):
            raise EngineError(
                f"the server returned no prompt logprobs for the {len(prompt)} probe tokens "
                f"(got {json.dumps(positions)[:200]})"
            )
        values = [0.0]
        for position, token in zip(positions[1:], prompt[1:], strict=True):
            values.append(float(position[str(token)]["logprob"]))
        return values
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise EngineError(f"malformed prompt logprobs: {exc!r}") from exc
