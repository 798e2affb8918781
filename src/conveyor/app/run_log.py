"""The console of `conveyor train` and `conveyor eval` carries our progress and results; what the
libraries underneath say (vLLM, transformers, torch, Ray: their loggers and Python warnings) goes
to the run's log file, `<run folder>/run.log`.

`capture()` wraps a command. From its start, log records and warnings are kept in memory, since
the engine (and with it most of vLLM's chatter) starts before the run folder exists, which is
made only once the engine answered; `attach(run_dir)`, called where the folder is made
(`conveyor.app.compose.make_run_dir`, or at once for a resumed run), writes them there and sends
the rest after them. What still reaches the console:
- records of conveyor's own loggers at WARNING and above, and conveyor's own Python warnings;
- any record at ERROR and above, whoever logs it (a library's real error is the user's business);
- at the end, one line saying how many library warnings the log holds, and where;
- everything kept, on stderr, when the command ends before a run folder exists (a failed engine
  start: its warnings are the diagnosis).

Below Python's logging, file descriptor 2 goes the same way (a temporary file, then the log):
torch's C++ warnings, vLLM's loading bars and what child processes print to stderr write there,
while our console lines are written to a copy of the real stderr.

vLLM installs its own handler (to stdout) when `vllm.logger` is first imported, unless
`VLLM_CONFIGURE_LOGGING=0`, which `capture` sets for this process (a replica server, another
process with its own log file, has it removed again: `conveyor.engines.vllm_replicas`).
Libraries that keep a stream handler of their own (transformers, Ray, huggingface_hub) hand
their records to the root logger instead, from the start of the command or, for one imported
later, from the moment the run folder exists (before that, their handler writes to fd 2, which
is held with the rest); nothing is imported here for it, so a refusal at start stays quick.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import conveyor

__all__ = ["LOG_FILE", "attach", "capture"]

LOG_FILE = "run.log"
OUR_PACKAGE = str(Path(conveyor.__file__).resolve().parent)
_OUR_LOGGER = "conveyor"
_KEPT_BEFORE_ATTACH = 20_000  # records held in memory before the run folder exists
# Per-request INFO lines of HTTP clients would make the log as long as the run's requests.
_QUIETER = {"httpx": logging.WARNING, "httpcore": logging.WARNING}
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_active: _RunLog | None = None


class _RunLogHandler(logging.Handler):
    """Every record at INFO and above: held until `attach`, then appended to the log file."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter(_FORMAT))
        self.held: list[logging.LogRecord] = []
        self.dropped = 0
        self.sink: TextIO | None = None
        self.path: Path | None = None
        self.library_warnings = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno == logging.WARNING and not _is_ours(record):
            self.library_warnings += 1
        if self.sink is None:
            if len(self.held) >= _KEPT_BEFORE_ATTACH:
                self.held.pop(0)
                self.dropped += 1
            self.held.append(record)
            return
        try:
            self.sink.write(self.format(record) + "\n")
            self.sink.flush()
        except Exception:
            self.handleError(record)

    def attach(self, path: Path) -> None:
        self.acquire()
        try:
            if self.sink is not None:
                return
            self.path = path
            self.sink = path.open("a", encoding="utf-8")  # a resumed run appends
            if self.dropped:
                self.sink.write(f"({self.dropped} earlier records were not kept)\n")
            for record in self.held:
                self.sink.write(self.format(record) + "\n")
            self.sink.flush()
            self.held = []
        finally:
            self.release()

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()
            self.sink = None
        super().close()


class _ConsoleFormatter(logging.Formatter):
    """Ours as before (the message alone); a library's error names its logger, so the user can
    tell whose it is."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text if _is_ours(record) else f"{record.levelname} {record.name}: {text}"


class _ConsoleFilter(logging.Filter):
    """On the console: conveyor's own warnings and errors, and anyone's errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        return record.levelno >= logging.WARNING and _is_ours(record)


def _is_ours(record: logging.LogRecord) -> bool:
    if record.name == "py.warnings":
        return bool(getattr(record, "conveyor_own", False))
    return record.name == _OUR_LOGGER or record.name.startswith(_OUR_LOGGER + ".")


class _StderrToLog:
    """File descriptor 2, where C and C++ code (torch's own warnings), progress bars and child
    processes write past Python's logging: into a temporary file until the run folder exists,
    then into its log. `console` writes to the real stderr meanwhile."""

    def __init__(self) -> None:
        sys.stderr.flush()
        self.saved = os.dup(2)
        # closed at the end of the command (`_RunLog.finish`)
        self.console: TextIO = open(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
        self.pending: Any = tempfile.TemporaryFile()
        os.dup2(self.pending.fileno(), 2)

    def attach(self, path: Path, sink: TextIO) -> None:
        """What was written so far goes after `sink`'s lines, and fd 2 into the file itself."""
        if self.pending is None:
            return
        sys.stderr.flush()
        self.pending.seek(0)
        sink.write(self.pending.read().decode("utf-8", "replace"))
        sink.flush()
        self.pending.close()
        self.pending = None
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, 2)
        os.close(fd)

    def restore(self) -> str:
        """fd 2 back to the console; what was never attached to a log, for the console."""
        sys.stderr.flush()
        held = ""
        if self.pending is not None:
            self.pending.seek(0)
            held = self.pending.read().decode("utf-8", "replace")
            self.pending.close()
            self.pending = None
        os.dup2(self.saved, 2)
        os.close(self.saved)
        return held


class _RunLog:
    """What `capture` changed, to be put back on exit."""

    def __init__(self, stream: TextIO | None) -> None:
        # the real console: fd 2 itself is redirected; a stream given (a test) is left alone
        self.redirect = _StderrToLog() if stream is None else None
        if self.redirect is not None:
            stream = self.redirect.console
        assert stream is not None
        self.stream = stream
        self.file = _RunLogHandler()
        self.console = logging.StreamHandler(stream)
        self.console.addFilter(_ConsoleFilter())
        self.console.setFormatter(_ConsoleFormatter())
        self.undo: list[Any] = []

    def start(self) -> None:
        root = logging.getLogger()
        self.undo.append(lambda level=root.level: root.setLevel(level))
        root.setLevel(logging.INFO)
        for handler in (self.file, self.console):
            root.addHandler(handler)
            self.undo.append(lambda handler=handler: root.removeHandler(handler))
        for name, level in _QUIETER.items():
            logger = logging.getLogger(name)
            self.undo.append(lambda logger=logger, old=logger.level: logger.setLevel(old))
            logger.setLevel(level)
        if "VLLM_CONFIGURE_LOGGING" not in os.environ:
            os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
            self.undo.append(lambda: os.environ.pop("VLLM_CONFIGURE_LOGGING", None))
        shown = warnings.showwarning
        warnings.showwarning = self.show_warning
        self.undo.append(lambda: setattr(warnings, "showwarning", shown))
        self.adopt_library_handlers()

    def show_warning(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        """A Python warning as a record of `py.warnings`: on the console when conveyor's own
        code raised it, in the log file only otherwise."""
        text = warnings.formatwarning(message, category, filename, lineno, line).rstrip()
        own = str(Path(filename).resolve()).startswith(OUR_PACKAGE)
        logging.getLogger("py.warnings").warning(text, extra={"conveyor_own": own})

    def adopt_library_handlers(self) -> None:
        """Libraries' loggers that print to the console through their own stream handler hand
        their records to the root logger instead (and so to the log file)."""
        consoles = {sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__}
        for name, logger in list(logging.root.manager.loggerDict.items()):
            if not isinstance(logger, logging.Logger) or name.split(".")[0] == _OUR_LOGGER:
                continue
            streams = [
                h
                for h in logger.handlers
                if isinstance(h, logging.StreamHandler)
                and not isinstance(h, logging.FileHandler)
                and h.stream in consoles
            ]
            if not streams:
                continue
            for handler in streams:
                logger.removeHandler(handler)
                self.undo.append(lambda lg=logger, h=handler: lg.addHandler(h))
            if not logger.propagate:
                logger.propagate = True
                self.undo.append(lambda lg=logger: setattr(lg, "propagate", False))

    def attach(self, path: Path) -> None:
        self.file.attach(path)
        if self.redirect is not None and self.file.sink is not None:
            self.redirect.attach(path, self.file.sink)
        # libraries imported since the start (Ray with the cluster, vLLM's helpers) add handlers
        self.adopt_library_handlers()

    def finish(self, failed: bool) -> None:
        file = self.file
        held = self.redirect.restore() if self.redirect is not None else ""
        if file.sink is None and failed:
            # no run folder to hold them: what the libraries said may be why the run failed
            formatter = logging.Formatter(_FORMAT)
            for record in file.held:
                if not self.console.filter(record):
                    self.stream.write(formatter.format(record) + "\n")
            self.stream.write(held)
        elif file.path is not None and file.library_warnings:
            self.stream.write(
                f"{file.library_warnings} warnings of the libraries underneath (vLLM, "
                f"transformers, torch...) are in {file.path}\n"
            )
        self.stream.flush()
        for undo in reversed(self.undo):
            undo()
        file.close()
        if self.redirect is not None:
            self.redirect.console.close()


@contextlib.contextmanager
def capture(run_dir: Path | None = None, stream: TextIO | None = None) -> Iterator[None]:
    """Route library logging and warnings to the run's log file for the enclosed command (see
    the module doc); `run_dir`: the run folder when it exists already (a resumed run), else
    `attach` names it once made. `stream`: the console (stderr)."""
    global _active
    if _active is not None:  # a command inside a command: the outer one holds the log
        yield
        return
    run_log = _RunLog(stream)
    _active = run_log
    failed = True
    try:
        run_log.start()
        if run_dir is not None and (Path(run_dir) / "config.yaml").is_file():
            attach(run_dir)  # a resumed run's folder (not one the command will refuse)
        yield
        failed = False
    finally:
        _active = None
        run_log.finish(failed)


def attach(run_dir: Path) -> None:
    """The run folder exists: the held records go to its `run.log`, and the later ones follow.
    Nothing without an active `capture` (a run started from Python, a test)."""
    if _active is not None:
        _active.attach(Path(run_dir) / LOG_FILE)
