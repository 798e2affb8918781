"""The GPU check's own code path, on the CPU with the tiny Qwen3 shape (the GPU itself is what
cannot exist here: the test's name says the device is faked by the CPU)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_on_cpu_stand_in_for_gpu(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "conveyor.trainer.gpu_check",
            "--shape",
            "tiny",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--tokens",
            "256,512",
            "--chunk-tokens",
            "64",
            "--steps",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == json.loads(out.read_text())
    assert report["exactness_float32"]["packed_vs_padded_max_abs"] < 1e-5
    assert report["exactness_float32"]["chunked_vs_full_max_abs"] < 1e-6
    cases = report["cases"]
    assert {(c["tokens"], c["layout"], c["logits"]) for c in cases} == {
        (t, lay, lg)
        for t in (256, 512)
        for lay in ("packed", "padded")
        for lg in ("chunked", "full")
    }
    for case in cases:
        assert case["error"] is None and case["tok_s"] > 0
        assert case["real_tokens"] == case["tokens"]
        if case["layout"] == "packed":
            assert case["processed_tokens"] == case["tokens"] and case["padding_fraction"] == 0
        else:
            assert case["processed_tokens"] > case["tokens"] and case["padding_fraction"] > 0
        # chunked logits are predicted smaller than full ones, same layout
    by = {(c["tokens"], c["layout"], c["logits"]): c["predicted_gib"] for c in cases}
    assert by[(512, "packed", "chunked")] < by[(512, "packed", "full")]


def test_gpu_check_script_is_valid_bash() -> None:
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu-check.sh")]).returncode == 0
