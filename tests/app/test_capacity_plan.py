"""`conveyor plan`: per-device memory of trainer and engines, placement, and refusals naming the
key to change; `conveyor train` runs the same check, before the run folder, on a GPU only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from conveyor import cli
from conveyor.app import plan as capacity
from conveyor.app.train import check_plan
from conveyor.config import ConfigError, load_config
from conveyor.models import default_model_dir

REPO = Path(__file__).resolve().parents[2]
SWE_GPU = REPO / "configs" / "swe-gpu.yaml"
SWE_GPU_4NODE = REPO / "configs" / "swe-gpu-4node.yaml"
QUICKSTART = REPO / "configs" / "filenav.yaml"
ONE_DEVICE = ["--set", "engine.replicas=1", "--gpus-per-node", "1", "--gpu-memory-gib", "80"]


def plan(*args: str) -> tuple[int, str, dict | None]:
    """The real CLI in this process: exit code, output, and the last line's JSON (with --json)."""
    result = CliRunner().invoke(cli.app, ["plan", *args])
    last = result.output.strip().splitlines()[-1] if result.output.strip() else ""
    report = json.loads(last) if "--json" in args and result.exit_code in (0, 1) else None
    return result.exit_code, result.output, report


def test_the_one_node_recipe_fits_eight_80gb_gpus() -> None:
    code, _, report = plan(
        str(SWE_GPU), "--nodes", "1", "--gpus-per-node", "8", "--gpu-memory-gib", "80", "--json"
    )
    assert code == 0 and report is not None and report["fits"] is True
    assert report["refusals"] == []
    assert report["model"]["architecture"].endswith("architectures/Qwen3-8B.json")
    # replicas on the last GPUs, FSDP over the others, no GPU holding both
    assert report["engine"]["devices"] == [6, 7] and report["trainer"]["devices"] == [
        0,
        1,
        2,
        3,
        4,
        5,
    ]
    assert report["trainer"]["shards"] == 6


def test_the_scale_twin_is_planned_from_the_tiny_qwen3_shape_without_building_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONVEYOR_CACHE", str(tmp_path))  # nothing built here
    twin = Path(__file__).resolve().parents[2] / "configs/scale-twin.yaml"
    code, _, report = plan(
        str(twin), "--nodes", "1", "--gpus-per-node", "4", "--gpu-memory-gib", "80", "--json"
    )
    assert code == 0 and report is not None and report["fits"] is True
    assert report["model"]["architecture"] == "builtin:tiny-qwen3"
    assert report["trainer"]["devices"] == [0, 1] and report["engine"]["devices"] == [2, 3]
    assert not any(tmp_path.iterdir())


def test_trainer_fsdp_ranks_sets_the_trainers_devices_and_is_refused_past_the_free_ones() -> None:
    hardware = ["--nodes", "1", "--gpus-per-node", "8", "--gpu-memory-gib", "80", "--json"]
    code, _, report = plan(str(SWE_GPU), "--set", "trainer.fsdp_ranks=4", *hardware)
    assert code == 0 and report is not None
    assert report["trainer"]["devices"] == [0, 1, 2, 3] and report["trainer"]["shards"] == 4
    code, _, report = plan(str(SWE_GPU), "--set", "trainer.fsdp_ranks=7", *hardware)
    assert code == 1 and report is not None
    assert "trainer.fsdp_ranks" in [r["key"] for r in report["refusals"]]


def test_the_four_node_recipe_fits_thirty_two_80gb_gpus() -> None:
    code, _, report = plan(
        str(SWE_GPU_4NODE),
        "--nodes",
        "4",
        "--gpus-per-node",
        "8",
        "--gpu-memory-gib",
        "80",
        "--json",
    )
    assert code == 0 and report is not None and report["fits"] is True
    assert report["model"]["parameters"] > 32e9
    assert report["engine"]["tensor_parallel_size"] == 2 and len(report["engine"]["devices"]) == 8
    assert report["trainer"]["shards"] == 24
    assert {d["node"] for d in report["devices"] if "engine" in d["roles"]} == {3}


def test_an_8b_full_fine_tune_on_one_80gb_device_is_refused_naming_the_key() -> None:
    code, output, report = plan(str(SWE_GPU), *ONE_DEVICE, "--json")
    assert code == 1 and report is not None and report["fits"] is False
    keys = [r["key"] for r in report["refusals"]]
    assert "trainer.lora.enabled" in keys  # the state alone (16 bytes a parameter) is 122 GiB
    trainer = report["trainer"]["per_device_gib"]
    assert trainer["total"] > 80 and trainer["optimizer"] > 60
    code, output, _ = plan(str(SWE_GPU), *ONE_DEVICE)
    assert code == 1
    assert output.strip().splitlines()[-1].startswith("does not fit: change ")
    assert "refused [trainer.lora.enabled]" in output


def test_the_recipe_as_first_shipped_is_refused_naming_the_key(tmp_path: Path) -> None:
    """One in-process engine at half of GPU 0 next to FSDP at 32k tokens a pass."""
    code, _, report = plan(
        str(SWE_GPU),
        "--set",
        "engine.replicas=1",
        "--set",
        "agent.max_context_tokens=32768",
        "--set",
        "agent.max_prompt_tokens=28000",
        "--set",
        "trainer.micro_batch_tokens=32768",
        "--json",
    )
    assert code == 1 and report is not None
    keys = {r["key"] for r in report["refusals"]}
    assert "engine.kv_cache_gib" in keys  # 40 GiB asked, 22.7 left of the 0.5 share
    assert report["engine"]["devices"] == [0] and 0 in report["trainer"]["devices"]


def test_without_kv_cache_gib_the_kv_cache_is_max_num_seqs_full_contexts(tmp_path: Path) -> None:
    config = tmp_path / "no-kv.yaml"
    config.write_text(
        "\n".join(line for line in SWE_GPU.read_text().splitlines() if "kv_cache_gib" not in line)
    )
    code, _, report = plan(str(config), "--json")
    assert code == 1 and report is not None
    engine = report["engine"]
    assert engine["kv_cache_from"] == "engine.max_num_seqs x agent.max_context_tokens"
    # 128 sequences x 16,384 tokens x 144 KiB a token (36 layers, 8 KV heads of 128, bf16)
    assert engine["per_device_gib"]["kv_cache"] == 288.0
    assert [r["key"] for r in report["refusals"]] == ["engine.max_num_seqs"]
    code, _, report = plan(str(config), "--set", "engine.max_num_seqs=16", "--json")
    assert code == 0 and report is not None and report["engine"]["full_context_sequences"] >= 16


def test_a_model_neither_on_disk_nor_shipped_is_refused_naming_model_path(tmp_path: Path) -> None:
    code, output, _ = plan(str(SWE_GPU), "--set", f"model.path={tmp_path / 'Llama-70B'}")
    assert code == 2
    assert "model.path" in output and "Llama-70B" in output and "Qwen3-8B" in output


@pytest.mark.parametrize("bad", [["--nodes", "0"], ["--gpu-memory-gib", "-1"]])
def test_bad_hardware_is_exit_2(bad: list[str]) -> None:
    code, output, _ = plan(str(SWE_GPU), *bad)
    assert code == 2 and "must be positive" in output


def test_the_json_contract_last_line_fits_and_per_role_per_device_memory() -> None:
    code, output, report = plan(str(SWE_GPU), "--json")
    assert code == 0 and report is not None
    assert len(output.strip().splitlines()) == 1  # nothing but the object
    assert isinstance(report["fits"], bool)
    trainer, engine = report["trainer"]["per_device_gib"], report["engine"]["per_device_gib"]
    for component in ("parameters", "gradients", "optimizer", "activations", "logits", "total"):
        assert isinstance(trainer[component], float | int)
    for component in ("weights", "kv_cache", "runtime_reserve", "total"):
        assert isinstance(engine[component], float | int)
    assert trainer["total"] <= report["trainer"]["budget_gib"]
    assert engine["total"] <= report["engine"]["budget_gib"]
    assert all(d["gib"] <= 80 for d in report["devices"])


@pytest.mark.skipif(
    not (default_model_dir() / "config.json").is_file(), reason="embedded model not prepared"
)
def test_the_embedded_model_is_planned_from_its_own_config_json() -> None:
    code, _, report = plan(
        str(QUICKSTART), "--gpus-per-node", "1", "--gpu-memory-gib", "16", "--json"
    )
    assert code == 0 and report is not None
    assert report["model"]["architecture"] == str(default_model_dir() / "config.json")
    assert 130e6 < report["model"]["parameters"] < 140e6  # SmolLM2-135M
    # in-process engine next to the trainer on GPU 0, with the KV cache the recipe gives it
    assert report["engine"]["devices"] == [0] and report["trainer"]["devices"] == [0]
    assert report["engine"]["kv_cache_from"] == "engine.kv_cache_gib"


def test_plan_loads_no_heavy_module() -> None:
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "import conveyor.cli\n"
        f"r = CliRunner().invoke(conveyor.cli.app, ['plan', {str(SWE_GPU)!r}, '--json'])\n"
        "assert r.exit_code == 0, r.output\n"
        "print([m for m in ('torch', 'vllm', 'ray', 'transformers') if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_train_on_cpu_is_unchanged_by_the_gpu_check() -> None:
    """Here (no GPU) the check is a no-op: the one-device 8B plan that `conveyor plan` refuses
    passes check_plan, as before."""
    resolved = load_config(SWE_GPU, ["engine.replicas=1", "run.dir=/nonexistent/run"])
    assert capacity.local_gpus() is None or pytest.skip("this machine has a GPU")
    check_plan(resolved)


def test_train_with_a_faked_gpu_refuses_a_config_that_cannot_fit_before_the_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU's presence is faked (`local_gpus`): this machine has none. The rest is the real
    `conveyor train` command."""
    monkeypatch.setattr(capacity, "local_gpus", lambda: capacity.Hardware(1, 1, 80.0))
    run = tmp_path / "run"
    result = CliRunner().invoke(
        cli.app,
        ["train", str(SWE_GPU), "--set", f"run.dir={run}", "--set", "engine.replicas=1"],
    )
    assert result.exit_code == 2, result.output
    assert "does not fit this machine's 1 GPU(s) of 80 GiB" in result.output
    assert "engine.kv_cache_gib" in result.output or "trainer." in result.output
    assert not run.exists()
    with pytest.raises(ConfigError, match="conveyor plan"):
        check_plan(load_config(SWE_GPU, [f"run.dir={run}", "engine.replicas=1"]))
    assert not run.exists()


def test_tensor_parallel_size_is_a_key_passed_to_vllm_and_refused_on_cpu_replica_servers() -> None:
    from conveyor.engines.base import EngineError
    from conveyor.engines.factory import vllm_options
    from conveyor.engines.memory import check_tensor_parallel
    from conveyor.engines.vllm_replicas import server_command

    config = load_config(SWE_GPU_4NODE).config
    assert vllm_options(config)["tensor_parallel_size"] == 2
    command = server_command(
        Path("/m"),
        1,
        max_num_seqs=1,
        max_model_len=8,
        dtype="bfloat16",
        seed=0,
        gpu_memory_utilization=0.85,
        extra_args=[],
        tensor_parallel_size=2,
    )
    assert command[command.index("--tensor-parallel-size") + 1] == "2"
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        load_config(SWE_GPU, ["engine.tensor_parallel_size=0"])
    with pytest.raises(EngineError, match=r"engine\.tensor_parallel_size=2"):
        check_tensor_parallel(2, gpu=False)
    check_tensor_parallel(1, gpu=False)


def test_cuda_graphs_follow_the_engine_host_unless_set_and_are_refused_without_a_gpu(
    model_dir: Path,
) -> None:
    """`engine.cuda_graphs`: null = graphs on a GPU host, eager on CPU; the choice reaches the
    in-process engine and each replica server's command; graphs asked for on CPU are refused by
    the engine before vLLM loads anything (the GPU side is decided by `torch.cuda`, faked here
    only as the flag a GPU host would pass)."""
    from conveyor.engines.base import EngineError
    from conveyor.engines.factory import vllm_options
    from conveyor.engines.memory import eager_mode
    from conveyor.engines.vllm_local import VLLMEngine
    from conveyor.engines.vllm_replicas import server_command

    assert [eager_mode(None, gpu) for gpu in (True, False)] == [False, True]
    assert [eager_mode(False, gpu) for gpu in (True, False)] == [True, True]
    assert eager_mode(True, True) is False
    assert vllm_options(load_config(SWE_GPU).config)["cuda_graphs"] is None
    set_false = load_config(SWE_GPU, ["engine.cuda_graphs=false"]).config
    assert vllm_options(set_false)["cuda_graphs"] is False

    def command(eager: bool) -> list[str]:
        return server_command(
            Path("/m"), 1, max_num_seqs=1, max_model_len=8, dtype="bfloat16", seed=0,
            gpu_memory_utilization=0.85, extra_args=[], eager=eager,
        )  # fmt: skip

    assert "--enforce-eager" in command(True) and "--enforce-eager" not in command(False)
    if not torch.cuda.is_available():
        with pytest.raises(EngineError, match=r"engine\.cuda_graphs is true, but .* no GPU"):
            VLLMEngine(model_dir, cuda_graphs=True)
