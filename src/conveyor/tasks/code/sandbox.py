"""The `code` family's grading program: runs INSIDE a fresh sandbox, never in the grader's process.

The grader writes this file, the problem (prompt, test, entry point) and the candidate program
into a fresh sandbox workspace and runs ``python3 -I code_sandbox.py judge ...``. Two processes
then take part, and the candidate's code only ever runs in the second:

- the judge (trusted) makes itself non-dumpable first (so no other process of the sandbox user
  can read its memory, open its file descriptors or ptrace it), reads a one-time nonce from a
  pipe the grader passes in (and closes it), runs the problem's prompt and test code, and calls
  `check(candidate)` with a proxy in place of the candidate;
- the worker (untrusted) runs the candidate program and answers the proxy's calls over pipes:
  arguments go in, results come back as tagged JSON that the judge rebuilds into plain builtin
  values (int, float, str, list, dict, range, and an iterator over the items of a returned
  generator or other iterator, which upstream's tests may consume), so no object of the
  candidate's (an `__eq__` that is always true, a patched `check`, a hooked builtin) ever
  reaches the judge. The worker's own
  stdout and stderr go to /dev/null, and it inherits none of the judge's file descriptors.

The judge's last line is ``CONVEYOR-VERDICT <nonce> passed`` only when `check` returned; the
grader accepts nothing else (exit code 0, not timed out, that exact last line). The candidate
cannot write the judge's stdout and never sees the nonce.

Only the standard library is used here (the program runs under ``python3 -I``).
"""

from __future__ import annotations

import builtins
import ctypes
import itertools
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

VERDICT = "CONVEYOR-VERDICT"
PASSED = "passed"
_PR_GET_DUMPABLE = 3
_PR_SET_DUMPABLE = 4
_MAX_DEPTH = 100
# Most items of an iterator a candidate returns that are passed back (an endless one fails).
_MAX_ITEMS = 1_000_000
_MAX_LINE_BYTES = 32 << 20
_MESSAGE_CHARS = 300


class CandidateError(Exception):
    """The candidate misbehaved (raised, died, timed out, answered nonsense)."""


# ---- values across the pipe: tagged JSON, rebuilt as plain builtin objects ------------------


def encode(value: Any, depth: int = 0) -> Any:
    """`value` as tagged JSON data; `TypeError` for what cannot cross (functions, objects)."""
    if depth > _MAX_DEPTH:
        raise TypeError("the value is nested too deeply")
    if value is None:
        return ["n"]
    if isinstance(value, bool):
        return ["b", bool(value)]
    if isinstance(value, int):
        return ["i", str(int(value))]
    if isinstance(value, float):
        return ["f", float.__repr__(float(value))]
    if isinstance(value, complex):
        return ["c", float.__repr__(value.real), float.__repr__(value.imag)]
    if isinstance(value, str):
        return ["s", str.__str__(value)]
    if isinstance(value, bytes | bytearray):
        return ["y", bytes(value).hex()]
    for kind, tag in ((list, "l"), (tuple, "t"), (set, "e"), (frozenset, "z")):
        if isinstance(value, kind):
            return [tag, [encode(item, depth + 1) for item in value]]
    if isinstance(value, dict):
        pairs = [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]
        return ["d", pairs]
    if isinstance(value, range):
        return ["r", str(value.start), str(value.stop), str(value.step)]
    if isinstance(value, Iterator):
        # a generator, map, filter, zip ...: upstream's check runs in the candidate's process
        # and consumes it there; here it is consumed in the worker and rebuilt as an iterator
        # over the same items (a test doing list(), sorted(), set() or a loop sees them; a
        # comparison with a list is False, as upstream).
        items = list(itertools.islice(value, _MAX_ITEMS + 1))
        if len(items) > _MAX_ITEMS:
            raise TypeError(f"an iterator of more than {_MAX_ITEMS} items cannot be passed")
        return ["g", [encode(item, depth + 1) for item in items]]
    converted = getattr(value, "tolist", None)  # numpy scalars and arrays
    if callable(converted):
        return encode(converted(), depth + 1)
    raise TypeError(f"a {type(value).__name__} cannot be passed between processes")


def decode(node: Any, depth: int = 0) -> Any:
    """The plain value of tagged JSON data; `CandidateError` for anything malformed."""
    if depth > _MAX_DEPTH:
        raise CandidateError("value nested too deeply")
    if not isinstance(node, list) or not node or not isinstance(node[0], str):
        raise CandidateError("malformed value")
    tag, rest = node[0], node[1:]
    try:
        if tag == "n" and not rest:
            return None
        if tag == "b" and len(rest) == 1 and type(rest[0]) is bool:
            return rest[0]
        if tag == "i" and len(rest) == 1 and type(rest[0]) is str:
            return int(rest[0])
        if tag == "f" and len(rest) == 1 and type(rest[0]) is str:
            return float(rest[0])
        if tag == "c" and len(rest) == 2 and all(type(x) is str for x in rest):
            return complex(float(rest[0]), float(rest[1]))
        if tag == "s" and len(rest) == 1 and type(rest[0]) is str:
            return rest[0]
        if tag == "y" and len(rest) == 1 and type(rest[0]) is str:
            return bytes.fromhex(rest[0])
        if tag == "r" and len(rest) == 3 and all(type(x) is str for x in rest):
            return range(int(rest[0]), int(rest[1]), int(rest[2]))
        if len(rest) == 1 and type(rest[0]) is list:
            items = rest[0]
            builders: dict[str, Callable[[list[Any]], Any]] = {
                "l": list,
                "t": tuple,
                "e": set,
                "z": frozenset,
            }
            if tag in builders:
                return builders[tag]([decode(item, depth + 1) for item in items])
            if tag == "g":
                return iter([decode(item, depth + 1) for item in items])
            if tag == "d":
                return dict(_pair(pair, depth) for pair in items)
    except (ValueError, TypeError, OverflowError) as error:
        raise CandidateError(f"malformed value: {error}") from None
    raise CandidateError(f"malformed value with tag {tag!r}")


def _pair(pair: Any, depth: int) -> tuple[Any, Any]:
    if not isinstance(pair, list) or len(pair) != 2:
        raise CandidateError("malformed dict item")
    return decode(pair[0], depth + 1), decode(pair[1], depth + 1)


# ---- line-framed JSON messages over pipes ---------------------------------------------------


def send(stream: IO[bytes], message: Any) -> None:
    """Write one JSON message as a line."""
    stream.write(json.dumps(message).encode() + b"\n")
    stream.flush()


class LineReader:
    """Reads newline-framed messages from a pipe with a deadline and a size cap."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""

    def read(self, deadline: float) -> Any:
        """The next message; `CandidateError` on EOF, timeout, oversize or bad JSON."""
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CandidateError("time limit exceeded")
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                raise CandidateError("the candidate's process ended")
            self.buffer += chunk
            if len(self.buffer) > _MAX_LINE_BYTES:
                raise CandidateError("the candidate's answer is too large")
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            return json.loads(line)
        except (ValueError, RecursionError):
            raise CandidateError("the candidate's process sent garbage") from None


def _no_digit_limit() -> None:
    """Big integers cross as decimal strings: lift Python 3.11's conversion limit."""
    lift = getattr(sys, "set_int_max_str_digits", None)
    if lift is not None:
        lift(0)


# ---- the judge (trusted) --------------------------------------------------------------------


def make_undumpable() -> None:
    """PR_SET_DUMPABLE 0: other processes of our user cannot ptrace us or open /proc/<us>/*."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    if libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError("could not make the judge non-dumpable")


class Worker:
    """The candidate's process, and a proxy function that calls the candidate in it."""

    def __init__(self, script: str, candidate: str, entry_point: str, deadline: float) -> None:
        self.deadline = deadline
        self.process = subprocess.Popen(
            [sys.executable, "-I", script, "worker", candidate, entry_point],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.requests: IO[bytes] = self.process.stdin
        self.answers = LineReader(self.process.stdout.fileno())
        ready = self.answers.read(deadline)
        if ready != {"ready": True}:
            problem = ready.get("load_error") if isinstance(ready, dict) else None
            raise CandidateError(f"the candidate did not load: {str(problem)[:_MESSAGE_CHARS]}")

    def call(self, *args: Any, **kwargs: Any) -> Any:
        """Call the candidate with `args` in the worker; its plain result, or its exception."""
        try:
            send(self.requests, {"args": encode(list(args)), "kwargs": encode(kwargs)})
        except (BrokenPipeError, OSError):
            raise CandidateError("the candidate's process ended") from None
        answer = self.answers.read(self.deadline)
        if isinstance(answer, dict) and set(answer) == {"ok"}:
            return decode(answer["ok"])
        if isinstance(answer, dict) and "raised" in answer:
            raise _rebuilt_exception(answer.get("raised"), answer.get("message"))
        raise CandidateError("the candidate's process sent garbage")

    def stop(self) -> None:
        """Kill the worker."""
        self.process.kill()
        self.process.wait()


def _rebuilt_exception(name: Any, message: Any) -> BaseException:
    """A builtin exception of the reported type (checks may expect one), else CandidateError."""
    text = str(message)[:_MESSAGE_CHARS]
    kind = getattr(builtins, str(name), None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        return kind(text)
    return CandidateError(f"the candidate raised {str(name)[:80]}: {text}")


def judge(problem_path: str, nonce_fd: int, timeout_s: float) -> int:
    """Run the problem's `check` against the candidate; print the verdict line last."""
    make_undumpable()
    nonce = os.read(nonce_fd, 256).decode().strip()
    os.close(nonce_fd)
    deadline = time.monotonic() + timeout_s
    with open(problem_path, encoding="utf-8") as handle:
        problem = json.load(handle)
    os.unlink(problem_path)  # the tests stay in this (non-dumpable) process only
    _no_digit_limit()
    worker: Worker | None = None
    try:
        folder = os.path.dirname(os.path.abspath(problem_path))
        candidate = os.path.join(folder, problem["candidate"])
        worker = Worker(os.path.abspath(__file__), candidate, problem["entry"], deadline)
        namespace: dict[str, Any] = {"__name__": "__judge__"}
        exec(compile(problem["prompt"], "prompt.py", "exec"), namespace)
        namespace[problem["entry"]] = worker.call
        exec(compile(problem["test"], "test.py", "exec"), namespace)
        namespace["check"](worker.call)
        outcome = PASSED
    except AssertionError:
        outcome = "failed: a test assertion failed"
    except CandidateError as error:
        outcome = f"failed: {error}"
    except Exception as error:
        outcome = f"failed: {type(error).__name__}: {str(error)[:_MESSAGE_CHARS]}"
    finally:
        if worker is not None:
            worker.stop()
    sys.stdout.write(f"\n{VERDICT} {nonce} {outcome}\n")
    sys.stdout.flush()
    return 0


# ---- the worker (untrusted: runs the candidate) -----------------------------------------------


def serve(candidate_path: str, entry_point: str) -> int:
    """Load the candidate program and answer calls until stdin closes."""
    requests = LineReader(os.dup(0))
    answers = os.fdopen(os.dup(1), "wb")
    quiet = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(quiet, fd)
    _no_digit_limit()
    try:
        with open(candidate_path, encoding="utf-8") as handle:
            source = handle.read()
        namespace: dict[str, Any] = {"__name__": "__candidate__"}
        exec(compile(source, "candidate.py", "exec"), namespace)
        function = namespace[entry_point]
        if not callable(function):
            raise TypeError(f"{entry_point} is not a function")
    except BaseException as error:
        send(answers, {"load_error": f"{type(error).__name__}: {error}"})
        return 1
    send(answers, {"ready": True})
    while True:
        try:
            request = requests.read(time.monotonic() + 24 * 3600)
        except CandidateError:
            return 0
        try:
            result = function(*decode(request["args"]), **decode(request["kwargs"]))
            send(answers, {"ok": encode(result)})
        except BaseException as error:
            send(answers, {"raised": type(error).__name__, "message": str(error)[:_MESSAGE_CHARS]})


def main(argv: list[str]) -> int:
    """``judge PROBLEM NONCE_FD TIMEOUT_S`` or ``worker CANDIDATE ENTRY_POINT``."""
    if len(argv) == 4 and argv[0] == "judge":
        return judge(argv[1], int(argv[2]), float(argv[3]))
    if len(argv) == 3 and argv[0] == "worker":
        return serve(argv[1], argv[2])
    sys.stderr.write(main.__doc__ or "")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
