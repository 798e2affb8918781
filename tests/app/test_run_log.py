"""The console of `conveyor eval`/`train` shows our progress and results; what the libraries
underneath say goes to the run's `run.log` (`conveyor.app.run_log`).

A plugin module stands in for a library (vLLM, transformers): it warns and logs through its own
logger and Python's `warnings` while the engine is built (before the run folder exists) and
while it samples (after), and logs one real error, which must still reach the user."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

from conveyor.app.run_log import LOG_FILE, OUR_PACKAGE, attach, capture

NOISY_LIBRARY = r"""
import logging
import os
import sys
import warnings

from conveyor.engines.factory import build_simulated
from conveyor.registry import ENGINES

log = logging.getLogger("noisylib.core")


@ENGINES.register("noisy_simulated")
def build(config, model_dir):
    warnings.warn("noisylib: this API is deprecated (at build)", FutureWarning)
    log.warning("noisylib: a log warning at build")
    log.info("noisylib: an info line at build")
    os.write(2, b"noisylib: C++ code writes to fd 2 at build\n")
    engine = build_simulated(config, model_dir)
    sample = engine.sample
    said = []

    async def noisy_sample(request):
        if not said:
            said.append(True)
            warnings.warn("noisylib: a warning while sampling", UserWarning)
            log.warning("noisylib: a log warning while sampling")
            log.error("noisylib: a real error while sampling")
            sys.stderr.write("noisylib: a progress bar while sampling\r\n")
        return await sample(request)

    engine.sample = noisy_sample
    return engine
"""


def test_eval_sends_library_warnings_to_the_run_log_and_keeps_its_own_lines(
    tmp_path: Path, model_dir: Path
) -> None:
    (tmp_path / "noisylib.py").write_text(NOISY_LIBRARY)
    config = tmp_path / "eval.yaml"
    config.write_text(
        "plugins: [noisylib]\n"
        "engine: {kind: noisy_simulated}\n"
        "tasks: {families: [arithmetic], num_tasks: 2, group_size: 1}\n"
        "agent: {max_turns: 1, max_completion_tokens: 8}\n"
        f"run: {{dir: {tmp_path / 'run'}}}\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "eval", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    console = done.stdout + done.stderr
    log = (tmp_path / "run" / LOG_FILE).read_text()

    # our own lines: the result and the run folder
    assert "rollouts=2" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == str(tmp_path / "run")
    # the library's warnings, before the folder existed and after, are in the log only
    for said in (
        "this API is deprecated (at build)",
        "a log warning at build",
        "an info line at build",
        "a warning while sampling",
        "a log warning while sampling",
        "C++ code writes to fd 2 at build",
        "a progress bar while sampling",
    ):
        assert said in log, said
        assert said not in console, said
    assert "FutureWarning" in log and "UserWarning" in log
    # a real error still reaches the user, and the console says where the rest went
    assert "noisylib: a real error while sampling" in done.stderr
    assert f"are in {tmp_path / 'run' / LOG_FILE}" in done.stderr


def test_our_own_warnings_stay_on_the_console_and_a_failed_start_shows_what_was_held(
    tmp_path: Path,
) -> None:
    console = io.StringIO()
    root_handlers = list(logging.getLogger().handlers)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        try:
            with capture(stream=console):
                logging.getLogger("conveyor.runtime.local").warning("ours: no isolation")
                logging.getLogger("somelib").warning("theirs: before the folder")
                raise RuntimeError("the engine did not start")
        except RuntimeError:
            pass
    text = console.getvalue()
    # ours at once; theirs only because the command failed with no run folder to hold it
    assert text.index("ours: no isolation") < text.index("theirs: before the folder")
    assert logging.getLogger().handlers == root_handlers  # everything put back

    console = io.StringIO()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        with capture(stream=console):
            ours = str(Path(OUR_PACKAGE) / "runtime" / "local.py")
            warnings.warn_explicit("ours: a Python warning", RuntimeWarning, ours, 1)
            warnings.warn("theirs: a Python warning", UserWarning, stacklevel=1)
            logging.getLogger("somelib").warning("theirs: kept for the folder")
            attach(tmp_path)
            logging.getLogger("somelib").warning("theirs: after the folder")
    assert "ours: a Python warning" in console.getvalue()
    assert "theirs" not in console.getvalue().replace(str(tmp_path), "")
    log = (tmp_path / LOG_FILE).read_text()
    # raised in this test file, outside conveyor's package: a library's warning
    for said in ("theirs: a Python warning", "theirs: kept for", "theirs: after the folder"):
        assert said in log, said
