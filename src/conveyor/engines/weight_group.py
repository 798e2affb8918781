"""Weight sync by collectives: the trainer broadcasts its weights into the vLLM workers.

The safetensors path (`VLLMServerEngine` writes a folder, the server reloads it) costs a full
serialisation, a file on a shared filesystem and a parse per replica. Here the engine's
workers join a `torch.distributed` process group with the trainer side (gloo on CPU, NCCL on
GPU) and receive the weights as broadcasts, bucket by bucket, straight into vLLM's in-place
`reload_weights` (so the CPU backend's GEMM re-packing and vLLM's own name mapping, fusing and
tensor-parallel narrowing all run as for a file).

Pieces:
- `WeightGroupExtension`: vLLM's worker extension (`worker_extension_cls=WORKER_EXTENSION`, or
  `--worker-extension-cls` on a server). Its methods are reached with `collective_rpc`:
  `conveyor_join_weight_group(spec)` (open the group; returns the dtype the engine holds its
  weights in) and `conveyor_receive_weights(spec)` (receive the buckets and reload).
- `WeightSender`: the trainer side, rank 0 of the group. It hosts the group's `TCPStore`
  (port picked free), opens the group while the workers join, and broadcasts. Tensors are cast
  to the engine's dtype before they travel (the engine would cast them on load anyway, with the
  same rounding: the result is bit-identical to the file path, and bf16 halves the bytes).
- Buckets (`plan_buckets`): tensors in export order, packed end to end into flat buffers of
  at most `bucket_mb` (a larger tensor goes alone); the plan (names, shapes) travels in the RPC,
  the bytes by broadcast. Memory on either side: one bucket, not a second copy of the model.

Group ranks: the sender is 0; an engine's workers take `rank_offset + tensor-parallel rank`.
A tensor-parallel engine's workers each receive every full tensor and keep their own shard
(vLLM's weight loaders narrow on load); what veRL and prime-rl do with NCCL broadcast too.

The group's two sides must run at once: the in-process engine receives on its engine thread
while the sender broadcasts from a worker thread; a server receives inside its
`/collective_rpc` request while the sender broadcasts. A group is opened once per engine (at
its first collective sync) and reused; a failed sync closes it, so the next opens a new one.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from torch import Tensor
    from torch.distributed import ProcessGroup, Store

WORKER_EXTENSION = "conveyor.engines.weight_group.WeightGroupExtension"

WeightSyncMode = Literal["auto", "collective", "safetensors"]

# Default bucket size: big enough that per-broadcast latency vanishes, small enough that the
# sender's and each worker's staging buffer stays negligible next to the model.
DEFAULT_BUCKET_MB = 256
# How long opening the group or one broadcast may wait for the other side.
GROUP_TIMEOUT_S = 300.0

# A bucket plan: per bucket, (name, shape) of each tensor, in order.
BucketPlan = list[list[tuple[str, list[int]]]]


@dataclass(frozen=True)
class GroupSpec:
    """Where and how an engine's workers join the group (sent as JSON to the workers)."""

    host: str
    port: int
    world_size: int
    rank_offset: int = 1
    backend: str = "gloo"
    timeout_s: float = GROUP_TIMEOUT_S

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> GroupSpec:
        return cls(**json.loads(text))


def plan_buckets(
    named: Sequence[tuple[str, Tensor]], bucket_bytes: int, element_size: int
) -> BucketPlan:
    """Group `named` tensors in order into buckets of at most `bucket_bytes` (a tensor bigger
    than that gets a bucket of its own), each element `element_size` bytes as sent."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket size must be positive, got {bucket_bytes}")
    plan: BucketPlan = []
    current: list[tuple[str, list[int]]] = []
    used = 0
    for name, tensor in named:
        size = tensor.numel() * element_size
        if current and used + size > bucket_bytes:
            plan.append(current)
            current, used = [], 0
        current.append((name, list(tensor.shape)))
        used += size
    if current:
        plan.append(current)
    return plan


def _numel(shape: Sequence[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def open_group(
    spec: GroupSpec, rank: int, store: Store | None = None
) -> tuple[ProcessGroup, Store]:
    """Join the group `spec` describes as `rank` (rank 0 passes the store it hosts)."""
    import torch
    from torch.distributed import PrefixStore, ProcessGroup, TCPStore

    timeout = timedelta(seconds=spec.timeout_s)
    if store is None:
        store = TCPStore(spec.host, spec.port, spec.world_size, False, timeout=timeout)
    prefixed = PrefixStore(f"conveyor-weights-{spec.port}", store)
    group = ProcessGroup(prefixed, rank, spec.world_size)
    if spec.backend == "gloo":
        from torch.distributed import ProcessGroupGloo

        device = (
            ProcessGroupGloo.create_device(hostname="127.0.0.1")
            if _is_loopback(spec.host)
            else ProcessGroupGloo.create_default_device()
        )
        options = ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        options._devices = [device]
        options._timeout = timeout
        backend: Any = ProcessGroupGloo(prefixed, rank, spec.world_size, options)
        kind = ProcessGroup.BackendType.GLOO
        on = torch.device("cpu")
    elif spec.backend == "nccl":  # GPU only; not exercised on this project's CPU CI
        from torch.distributed import ProcessGroupNCCL

        nccl_options = ProcessGroupNCCL.Options()
        nccl_options._timeout = timeout
        backend = ProcessGroupNCCL(prefixed, rank, spec.world_size, nccl_options)
        kind = ProcessGroup.BackendType.NCCL
        on = torch.device("cuda", torch.cuda.current_device())
    else:
        raise ValueError(f"weight group backend must be 'gloo' or 'nccl', not {spec.backend!r}")
    group._set_default_backend(kind)
    group._register_backend(on, kind, backend)
    return group, store


def broadcast(group: ProcessGroup, tensor: Tensor) -> None:
    """Broadcast `tensor` from group rank 0 (in place on the other ranks)."""
    from torch.distributed import BroadcastOptions

    options = BroadcastOptions()
    options.rootRank = 0
    options.rootTensor = 0
    group.broadcast([tensor], options).wait()


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def local_address_towards(url: str) -> str:
    """The address of this machine that the host of `url` reaches it at (loopback for a local
    server): where a remote engine's workers find the sender's store."""
    host = urllib.parse.urlsplit(url).hostname or "127.0.0.1"
    if _is_loopback(host):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))  # no packet is sent: this only picks the route
        return str(probe.getsockname()[0])


class WeightSender:
    """The trainer side of one weight group: hosts its store, broadcasts bucket by bucket.

    `open` creates the store (a free port of `host`) and returns the `GroupSpec` the engine's
    workers join with; `connect` then opens the group (it returns once every worker joined, so
    run it while they join). `send` broadcasts one update."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        backend: str = "gloo",
        bucket_mb: float = DEFAULT_BUCKET_MB,
        timeout_s: float = GROUP_TIMEOUT_S,
    ) -> None:
        if bucket_mb <= 0:
            raise ValueError(f"weight bucket size must be positive, got {bucket_mb} MB")
        self.host = host
        self.backend = backend
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.timeout_s = timeout_s
        self.spec: GroupSpec | None = None
        self._store: Store | None = None
        self._group: ProcessGroup | None = None

    @property
    def connected(self) -> bool:
        return self._group is not None

    def open(self, workers: int) -> GroupSpec:
        """Host the store for a group of this sender and `workers` engine workers."""
        from torch.distributed import TCPStore

        self.close()
        timeout = timedelta(seconds=self.timeout_s)
        store = TCPStore(self.host, 0, workers + 1, True, timeout=timeout, wait_for_workers=False)
        self._store = store
        self.spec = GroupSpec(
            host=self.host,
            port=int(store.port),
            world_size=workers + 1,
            backend=self.backend,
            timeout_s=self.timeout_s,
        )
        return self.spec

    def connect(self) -> None:
        """Open the group as rank 0 (blocks until every worker has joined)."""
        if self.spec is None or self._store is None:
            raise RuntimeError("WeightSender.connect before open")
        self._group, _ = open_group(self.spec, 0, self._store)

    def plan(self, named: Sequence[tuple[str, Tensor]], dtype: str) -> BucketPlan:
        import torch

        size = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        return plan_buckets(named, self.bucket_bytes, size)

    def send(self, named: Sequence[tuple[str, Tensor]], plan: BucketPlan, dtype: str) -> None:
        """Broadcast `named` (in `plan`'s order) as `dtype`, one flat buffer per bucket."""
        import torch

        if self._group is None:
            raise RuntimeError("WeightSender.send before connect")
        target = getattr(torch, dtype)
        device = torch.device("cuda") if self.backend == "nccl" else torch.device("cpu")
        tensors = dict(named)
        for bucket in plan:
            flat = torch.cat(
                [
                    tensors[name].detach().to(device=device, dtype=target).reshape(-1)
                    for name, _ in bucket
                ]
            )
            broadcast(self._group, flat)

    def close(self) -> None:
        """Drop the group and the store (the next sync opens a new one)."""
        group, self._group = self._group, None
        if group is not None:
            try:
                group.shutdown()
            except Exception:  # a broken group may refuse a clean shutdown
                pass
        self._store = None
        self.spec = None


def receive_plan(
    group: ProcessGroup, plan: BucketPlan, dtype: str, device: Any
) -> Iterator[tuple[str, Tensor]]:
    """Receive `plan`'s buckets from rank 0 and yield each tensor (a view of its bucket)."""
    import torch

    target = getattr(torch, dtype)
    for bucket in plan:
        sizes = [_numel(shape) for _, shape in bucket]
        flat = torch.empty(sum(sizes), dtype=target, device=device)
        broadcast(group, flat)
        for (name, shape), piece in zip(bucket, flat.split(sizes), strict=True):
            yield name, piece.view(shape)


class WeightGroupExtension:
    """Mixed into vLLM's worker class (`worker_extension_cls`); reached by `collective_rpc`.

    Method names carry a `conveyor_` prefix: vLLM refuses an extension whose attributes clash
    with the worker's own (its worker has `update_weights` for vLLM's NCCL transfer engine)."""

    # set by vLLM's worker; declared for the type checker
    model_runner: Any
    rank: int
    vllm_config: Any

    def conveyor_join_weight_group(self, spec: str) -> str:
        """Join the weight group `spec` (a `GroupSpec` as JSON) as `rank_offset` + this
        worker's tensor-parallel rank; returns the dtype the engine holds its weights in."""
        group_spec = GroupSpec.from_json(spec)
        self.conveyor_leave_weight_group()
        if group_spec.backend == "nccl":
            import torch

            torch.cuda.set_device(self.model_runner.device)
        rank = group_spec.rank_offset + _tp_rank()
        group, store = open_group(group_spec, rank)
        self._conveyor_group: ProcessGroup | None = group
        self._conveyor_store: Store | None = store
        return str(self.vllm_config.model_config.dtype).removeprefix("torch.")

    def conveyor_receive_weights(self, plan: str, dtype: str) -> int:
        """Receive one update (`plan`: a bucket plan as JSON) into the live model in place;
        returns the number of tensors received."""
        group = getattr(self, "_conveyor_group", None)
        if group is None:
            raise RuntimeError("conveyor_receive_weights before conveyor_join_weight_group")
        buckets: BucketPlan = [[(n, list(s)) for n, s in bucket] for bucket in json.loads(plan)]
        count = 0

        def counted() -> Iterable[tuple[str, Tensor]]:
            nonlocal count
            for item in receive_plan(group, buckets, dtype, self.model_runner.device):
                count += 1
                yield item

        reload = getattr(self, "reload_weights", None)
        if reload is not None:  # vLLM's Worker: sets the current vLLM config around the load
            reload(weights_iterator=counted())
        else:
            self.model_runner.reload_weights(weights_iterator=counted())
        return count

    def conveyor_readable_fingerprint(self) -> str:
        """This rank's `readable_fingerprint` (no probe, version 0) as JSON: digests of the
        tensors it keeps readable, as it holds them (a shard where vLLM splits the tensor)."""
        from conveyor.engines.base import readable_fingerprint

        named = self.model_runner.model.named_parameters()
        return readable_fingerprint(named, 0).model_dump_json()

    def conveyor_leave_weight_group(self) -> None:
        """Leave the weight group, if any."""
        group = getattr(self, "_conveyor_group", None)
        self._conveyor_group = None
        self._conveyor_store = None
        if group is not None:
            try:
                group.shutdown()
            except Exception:
                pass


def _tp_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tp_group

        return int(get_tp_group().rank_in_group)
    except (ImportError, AssertionError):
        return 0
