"""Shared fixtures: the real embedded model and its tokenizer, prepared once per machine, and a
real eval run made once per test run; the parallel scheduler of the test files."""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Two cores: torch threads fight every other process (10-70x slower) unless capped.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """The embedded SmolLM2-135M-Instruct HF folder (converted from the shipped GGUF once)."""
    from conveyor.models import prepare_default_model

    return prepare_default_model()


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path) -> Any:
    """The real SmolLM2 tokenizer."""
    from conveyor.engines.factory import load_tokenizer

    return load_tokenizer(model_dir)


REPO = Path(__file__).resolve().parents[1]

# One real `conveyor eval` run per test run, read by several files (the eval contract, the
# viewer, the Tinker bridge check): each used to make its own, the same command with the same
# sizes. The first worker that asks makes it under a file lock; the others wait and read it.
QUICKSTART_EVAL = [
    "tasks.num_tasks=2",
    "tasks.group_size=2",
    "agent.max_turns=2",
    "agent.max_completion_tokens=32",
]


@pytest.fixture(scope="session")
def quickstart_eval(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> tuple[Path, str]:
    """`conveyor eval configs/quickstart-eval.yaml` with `QUICKSTART_EVAL` (the embedded model
    on in-process vLLM: 2 families x 2 tasks x 2 samples): its run folder and what the command
    printed. Shared by the workers of this test run and by no other run; read it, never write
    into it."""
    import shutil
    import subprocess
    import sys

    del model_dir  # prepared first: the run evaluates it
    shared = _shared_dir(tmp_path_factory) / "quickstart-eval"
    printed = shared / "stdout.txt"
    with _locked(shared.with_suffix(".lock")):
        if not printed.is_file():
            run = shared / "run"
            shutil.rmtree(run, ignore_errors=True)  # what a worker that died making it left
            shared.mkdir(parents=True, exist_ok=True)
            args = [
                sys.executable,
                "-m",
                "conveyor.cli",
                "eval",
                str(REPO / "configs/quickstart-eval.yaml"),
            ]
            for item in [*QUICKSTART_EVAL, f"run.dir={run}"]:
                args += ["--set", item]
            done = subprocess.run(args, capture_output=True, text=True, timeout=900, cwd=REPO)
            if done.returncode != 0:
                pytest.fail(f"the shared quickstart eval failed:\n{done.stderr[-3000:]}")
            printed.write_text(done.stdout)
    return shared / "run", printed.read_text()


def _shared_dir(factory: pytest.TempPathFactory) -> Path:
    """A folder of this test run that every xdist worker sees: the parent of the workers' own
    temp folders (a run of its own), or the temp folder of a run without workers."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (created) between processes, held for the block."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# Parallel runs (`pytest -n 2 --dist loadgroup`, what scripts/test.sh does): each file stays on
# one worker, so a module's fixtures (a vLLM server, an engine) start once; the files that start
# Ray clusters share one group, so two clusters never run at once on one machine. A scheduler of
# our own: with pytest 9, xdist 3.8's `xdist_group` marks no longer reach its loadgroup
# scheduler (it renames `item._nodeid`, which pytest 9's `nodeid` no longer reads).
RAY_FILES = {"test_cluster.py", "test_compose.py", "test_dispatch_ray.py", "test_ray_fsdp.py"}


def test_group(nodeid: str) -> str:
    """The worker group of a test: its file, or "ray" for the files that start Ray."""
    path = nodeid.split("::", 1)[0]
    return "ray" if Path(path).name in RAY_FILES else path


DURATIONS = Path(__file__).with_name("durations.json")
DEFAULT_TEST_S = 1.0  # a group the last full run did not time: this many seconds per test


def group_cost(group: str, tests: int) -> float:
    """Seconds a group of tests is expected to take (see `DURATIONS`)."""
    known = _durations().get(group)
    return known if known is not None else DEFAULT_TEST_S * tests


@functools.cache
def _durations() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


# What this run took per group (controller side): written to $CONVEYOR_TEST_DURATIONS_OUT at
# the end where set, to refresh `DURATIONS` from a full run (`cp` it over, then commit).
_MEASURED: dict[str, float] = {}


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None  # xdist's own schedulers for every other --dist
    from xdist.scheduler import LoadScopeScheduling

    class FileGroups(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return test_group(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            # Longest first (by the last full run's seconds per group, tests/durations.json):
            # by xdist's own order (most tests first) the slowest one-test files came last and
            # ran alone at the end of the run, one worker idle (measured: a 585 s tail). Only
            # groups the worker collected whole (a replacement's collection may differ).
            known = set(self.registered_collections[node])
            runnable = [g for g, unit in self.workqueue.items() if known.issuperset(unit)]
            if not runnable:
                log_line(
                    config,
                    f"worker {node.gateway.id}: none of the files left is one it collected "
                    "whole; it stops",
                )
                node.shutdown()
                return
            longest = max(runnable, key=lambda g: group_cost(g, len(self.workqueue[g])))
            self.workqueue.move_to_end(longest, last=False)
            super()._assign_work_unit(node)

        def add_node_collection(self, node: Any, collection: Any) -> None:
            # xdist's own leaves a replacement worker whose collection differs from the run's
            # unregistered: it never gets work (and a run left with no other worker never
            # ends). Here it is said, and the worker runs the files it collected whole
            # (`_assign_work_unit`).
            ids = list(collection)
            if self.collection_is_completed and ids != self.collection:
                missing = sorted(set(self.collection) - set(ids))
                extra = sorted(set(ids) - set(self.collection))
                log_line(
                    config,
                    f"worker {node.gateway.id} collected other tests than the run: "
                    f"{len(missing)} missing {missing[:3]}, {len(extra)} extra {extra[:3]}"
                    f"{'' if missing or extra else ' (same tests, another order)'}",
                )
                self.registered_collections[node] = ids
                return
            super().add_node_collection(node, collection)

        def _reschedule(self, node: Any) -> None:
            # A fresh worker is known from its start but has no collection until it finishes
            # collecting; xdist's own gives it work then and fails (KeyError, an internal error
            # that ends the run) when two workers are replaced at once. It gets work when its
            # collection arrives (`schedule()` runs again then).
            if node not in self.registered_collections:
                return
            super()._reschedule(node)
            # A worker holds back the last test it was sent until it knows the next one (or is
            # told to stop). xdist's own sends a replacement worker one file, so a one-test file
            # there waited forever (seen: a fresh worker idle for 16 minutes, the rest of the run
            # on one worker). Keep two tests pending while there is work.
            while (
                self.workqueue
                and not node.shutting_down
                and self._pending_of(self.assigned_work[node]) < 2
            ):
                self._assign_work_unit(node)

        def remove_node(self, node: Any) -> str | None:
            # xdist's own puts a crashed worker's file back whole, the test that crashed it
            # included, so a test that kills its worker (out of memory, say) ran up to eight
            # times. Here it is reported once, as a failure, and the rest of its file goes on.
            # A worker that retired itself (see `pytest_runtest_protocol`) crashed nothing:
            # its queued files go back whole.
            workload = self.assigned_work.pop(node)
            retired = _retired_marker(os.getpid(), node.gateway.id)
            crashed: str | None = None
            if retired.is_file():
                why = retired.read_text()
                retired.unlink()
                log_line(config, f"worker {node.gateway.id} retired ({why}); a fresh one starts")
            else:  # the first test not completed is the one that was running
                for unit in workload.values():
                    crashed = next((n for n, completed in unit.items() if not completed), None)
                    if crashed is not None:
                        unit[crashed] = True
                        break
            left = {scope: u for scope, u in workload.items() if not all(u.values())}
            self.workqueue.update(left)
            for other in self.assigned_work:
                self._reschedule(other)
            return crashed

    return FileGroups(config, log)


def _proc_kib(path: str, key: str) -> int | None:
    """A `key:` line's value (kB) of a /proc status file, None where there is none."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _machine_state() -> str:
    """Free disk under the test temp folder and available memory: what a failure ran beside."""
    import shutil
    import tempfile

    free_gb = shutil.disk_usage(tempfile.gettempdir()).free / 2**30
    available = _proc_kib("/proc/meminfo", "MemAvailable")
    shown = "?" if available is None else f"{available / 2**20:.1f}"
    return f"disk free {free_gb:.1f} GiB, memory available {shown} GiB"


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Name each failure (and each test over two minutes) the moment it ends.

    CI keeps only the tail of a run's output: a run stopped by its time limit never reaches
    pytest's summary, so without these lines its failures have no names.
    """
    if _CONFIG is None or hasattr(_CONFIG, "workerinput"):
        return  # xdist workers report to the controller, which prints
    group = test_group(report.nodeid)
    _MEASURED[group] = _MEASURED.get(group, 0.0) + report.duration
    worker = getattr(report, "node", None)
    where = f" [{worker.gateway.id}]" if worker is not None else ""
    if report.failed:
        log_line(
            _CONFIG,
            f"FAILED {report.nodeid} ({report.when}, {report.duration:.0f} s){where}; "
            f"{_machine_state()}",
        )
    elif report.when == "call" and report.duration > 120:
        log_line(_CONFIG, f"slow {report.nodeid} {report.duration:.0f} s{where}")


_CONFIG: pytest.Config | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _CONFIG
    _CONFIG = config


@pytest.fixture(autouse=True, scope="module")
def _no_event_loop_left_running() -> Any:
    """A test file must not leave an event loop marked running in the main thread.

    One that does makes every later `asyncio.run` in the same process fail at once ("cannot be
    called from a running event loop"): 84 tests of one xdist worker failed that way after the
    viewer's files, whose session-wide playwright browser (sync API) held such a loop. Checked
    when the file's own fixtures are torn down; the file that leaks it errors here, named, and
    the mark is cleared for the files after it.
    """
    import asyncio

    yield
    leaked = asyncio._get_running_loop()
    if leaked is not None:
        asyncio.events._set_running_loop(None)
        pytest.fail(f"this file left an event loop running in the main thread: {leaked!r}")


# A parallel worker's memory only grows: Python and glibc keep what in-process vLLM engines and
# trainers freed (measured: one worker at 7 GB after a few such files, then 10.9 GB, and the
# kernel's OOM killer took it with the other worker's training subprocess beside it). A worker
# above RETIRE_MB when it finishes a file exits there, between two files, and xdist starts a
# fresh one (~20 s of collection); its queued files go to the workers left.
RETIRE_MB = int(os.environ.get("CONVEYOR_TEST_WORKER_RETIRE_MB", "4000"))


def _retired_marker(controller_pid: int, worker_id: str) -> Path:
    import tempfile

    return Path(tempfile.gettempdir()) / f"conveyor-xdist-{controller_pid}" / worker_id


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):
        import shutil

        shutil.rmtree(_retired_marker(os.getpid(), "-").parent, ignore_errors=True)
        out = os.environ.get("CONVEYOR_TEST_DURATIONS_OUT")
        if out:
            rounded = {g: round(s, 1) for g, s in sorted(_MEASURED.items())}
            Path(out).write_text(json.dumps(rounded, indent=1) + "\n")


def log_line(config: pytest.Config, text: str) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write("\n")
        reporter.write_line(text)


_LAST_FILE: Path | None = None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """In a parallel worker, at the first test of a new file: retire if memory is past
    RETIRE_MB. The file before is finished (its reports sent, its fixtures torn down) and this
    test has not begun, so the controller puts this file back whole (`remove_node`)."""
    global _LAST_FILE
    previous, _LAST_FILE = _LAST_FILE, item.path
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None or previous is None or previous == item.path:
        return
    rss = (_proc_kib("/proc/self/status", "VmRSS") or 0) / 1024
    if rss <= RETIRE_MB:
        return
    marker = _retired_marker(os.getppid(), worker)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"{rss:.0f} MB after {previous.name}")
    os._exit(0)
