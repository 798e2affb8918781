"""Exact-answer math problems that are easier with a Python executor than by hand.

Generated from templates (big modular powers, digit sums of factorials, sums and counts over
ranges with divisibility or digit constraints, subset sums, exact rational sums, Fibonacci
numbers mod m, primes in an interval, binomial coefficients mod 10^d, divisor counts), with
random parameters; the answer is an integer or a reduced fraction, computed here by our own
code (closed forms, dynamic programming, segmented sieves), never by running generated text. An
instance's split is a hash of its question, so no seed moves a question between splits.

Tools: `python` (the sandboxed executor, `conveyor.tasks.executor`) and `finish(answer)`. Reward:
1.0 when the answer is exactly one number equal to the expected value after normalisation
(spaces, thousands separators, `$...$`, `\\boxed{...}`, `**...**`, a trailing period; `p/q` and
`\\frac{p}{q}` for fractions; decimals only when exactly equal), else 0.0: several numbers, an
expression (``2**10``, ``10!``) or words around the number score 0.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from pydantic import BaseModel, ConfigDict, Field, field_validator

from conveyor.agent.parsing import format_tool_call
from conveyor.agent.tools import ToolRegistry, finish
from conveyor.config import RuntimeConfig
from conveyor.runtime.base import Runtime
from conveyor.tasks.executor import (
    DEFAULT_OUTPUT_CHARS,
    DEFAULT_TIMEOUT_S,
    EXECUTOR_RUNTIMES,
    make_python_tool,
    start_executor_runtime,
)
from conveyor.tasks.family import (
    SPLIT_SHARES,
    FamilyServices,
    family_options,
    instance_task,
    opening,
    register_family,
    runtime_choice,
    sample_instances,
)
from conveyor.types import Task, ToolCall

MAX_ANSWER_CHARS = 200


@dataclass(frozen=True)
class Problem:
    """One generated problem: the question, the exact answer and a program that computes it
    (the oracle's `python` call)."""

    template: str
    question: str
    answer: Fraction
    code: str


# ---- exact computations (ours; generated text is never run here) ----------------------------


def _sum_of_multiples(d: int, n: int) -> int:
    t = n // d
    return d * t * (t + 1) // 2


def _digit_sum_count(n: int, s: int) -> int:
    """How many integers in [1, n] have digit sum `s` (s >= 1), by digit DP."""
    digits = [int(c) for c in str(n)]
    # Numbers below n: a prefix of n's digits, then a smaller digit, then free digits.
    count = 0
    prefix = 0
    for i, top in enumerate(digits):
        free = len(digits) - i - 1
        for d in range(top):
            need = s - prefix - d
            count += _free_digits(free, need)
        prefix += top
    if prefix == s:
        count += 1
    return count  # 0 itself has digit sum 0, never counted for s >= 1


def _free_digits(positions: int, total: int) -> int:
    """Strings of `positions` decimal digits summing to `total`."""
    if total < 0 or total > 9 * positions:
        return 0
    ways = [1] + [0] * total
    for _ in range(positions):
        nxt = [0] * (total + 1)
        for t in range(total + 1):
            if ways[t]:
                for d in range(10):
                    if t + d > total:
                        break
                    nxt[t + d] += ways[t]
        ways = nxt
    return ways[total]


def _subsets_divisible(n: int, m: int) -> int:
    counts = [1] + [0] * (m - 1)
    for k in range(1, n + 1):
        counts = [counts[r] + counts[(r - k) % m] for r in range(m)]
    return counts[0]


def _fibonacci_mod(n: int, m: int) -> int:
    """F(n) mod m by fast doubling (F(1) = F(2) = 1)."""

    def pair(k: int) -> tuple[int, int]:
        if k == 0:
            return 0, 1
        a, b = pair(k >> 1)
        c = a * ((2 * b - a) % m) % m
        d = (a * a + b * b) % m
        return (d, (c + d) % m) if k & 1 else (c, d)

    return pair(n)[0]


def _primes_between(lo: int, hi: int) -> int:
    """Primes p with lo <= p <= hi, by a segmented sieve."""
    root = math.isqrt(hi)
    small = bytearray([1]) * (root + 1)
    small[0:2] = b"\0\0"
    for i in range(2, math.isqrt(root) + 1):
        if small[i]:
            small[i * i :: i] = bytes(len(range(i * i, root + 1, i)))
    segment = bytearray([1]) * (hi - lo + 1)
    for p in (i for i in range(2, root + 1) if small[i]):
        start = max(p * p, (lo + p - 1) // p * p)
        segment[start - lo :: p] = bytes(len(range(start, hi + 1, p)))
    for v in (0, 1):
        if lo <= v <= hi:
            segment[v - lo] = 0
    return sum(segment)


# ---- templates --------------------------------------------------------------------------------


def _modpow(rng: random.Random) -> Problem:
    a, b, m = rng.randint(2, 10**6), rng.randint(10**9, 10**18), rng.randint(10**6, 10**9)
    return Problem(
        "modpow",
        f"What is the remainder when {a}^{b} is divided by {m}?",
        Fraction(pow(a, b, m)),
        f"print(pow({a}, {b}, {m}))",
    )


def _factorial_digits(rng: random.Random) -> Problem:
    n = rng.randint(100, 1000)
    return Problem(
        "factorial_digit_sum",
        f"What is the sum of the decimal digits of {n}! (the factorial of {n})?",
        Fraction(sum(int(c) for c in str(math.factorial(n)))),
        f"import math\nprint(sum(int(c) for c in str(math.factorial({n}))))",
    )


def _divisible_sum(rng: random.Random) -> Problem:
    n = rng.randint(10**5, 10**6)
    a, b = rng.sample(range(3, 14), 2)
    c = rng.choice([x for x in range(2, 10) if a % x and b % x] or [11])
    lab, lac, lbc = math.lcm(a, b), math.lcm(a, c), math.lcm(b, c)
    either = _sum_of_multiples(a, n) + _sum_of_multiples(b, n) - _sum_of_multiples(lab, n)
    with_c = _sum_of_multiples(lac, n) + _sum_of_multiples(lbc, n)
    with_c -= _sum_of_multiples(math.lcm(a, b, c), n)
    return Problem(
        "divisible_sum",
        f"What is the sum of all integers k with 1 <= k <= {n} such that k is divisible by {a} "
        f"or by {b}, but not by {c}?",
        Fraction(either - with_c),
        f"print(sum(k for k in range(1, {n} + 1) if (k % {a} == 0 or k % {b} == 0) "
        f"and k % {c} != 0))",
    )


def _digit_sum_count_problem(rng: random.Random) -> Problem:
    n, s = rng.randint(10**5, 5 * 10**5), rng.randint(5, 40)
    return Problem(
        "digit_sum_count",
        f"How many integers from 1 to {n} inclusive have a decimal digit sum of exactly {s}?",
        Fraction(_digit_sum_count(n, s)),
        f"print(sum(1 for k in range(1, {n} + 1) if sum(map(int, str(k))) == {s}))",
    )


def _subset_sums(rng: random.Random) -> Problem:
    n, m = rng.randint(12, 40), rng.randint(3, 17)
    return Problem(
        "subset_sums",
        f"How many subsets of {{1, 2, ..., {n}}} (the empty set included) have a sum that is "
        f"divisible by {m}?",
        Fraction(_subsets_divisible(n, m)),
        f"c = [1] + [0] * {m - 1}\nfor k in range(1, {n + 1}):\n"
        f"    c = [c[r] + c[(r - k) % {m}] for r in range({m})]\nprint(c[0])",
    )


def _power_sum(rng: random.Random) -> Problem:
    n, e = rng.randint(8, 30), rng.randint(1, 3)
    total = sum((Fraction(1, k**e) for k in range(1, n + 1)), Fraction(0))
    term = "1/k" if e == 1 else f"1/k^{e}"
    return Problem(
        "power_sum",
        f"What is the exact value of the sum of {term} for k = 1, 2, ..., {n}? "
        "Answer with a fraction p/q in lowest terms.",
        total,
        "from fractions import Fraction\n"
        f"print(sum(Fraction(1, k**{e}) for k in range(1, {n + 1})))",
    )


def _fibonacci(rng: random.Random) -> Problem:
    n, m = rng.randint(10**5, 10**6), rng.randint(10**3, 10**9)
    return Problem(
        "fibonacci_mod",
        f"Let F(1) = F(2) = 1 and F(k) = F(k-1) + F(k-2) for k > 2. What is F({n}) mod {m}?",
        Fraction(_fibonacci_mod(n, m)),
        f"a, b = 0, 1\nfor _ in range({n}):\n    a, b = b, (a + b) % {m}\nprint(a)",
    )


def _prime_count(rng: random.Random) -> Problem:
    lo = rng.randint(10**5, 2 * 10**6)
    hi = lo + rng.randint(10**4, 10**5)
    return Problem(
        "prime_count",
        f"How many prime numbers p satisfy {lo} <= p <= {hi}?",
        Fraction(_primes_between(lo, hi)),
        f"n = {hi}\ns = bytearray([1]) * (n + 1)\ns[0] = s[1] = 0\n"
        "for i in range(2, int(n**0.5) + 1):\n"
        "    if s[i]:\n        s[i*i::i] = bytes(len(range(i*i, n + 1, i)))\n"
        f"print(sum(s[{lo}:]))",
    )


def _binomial(rng: random.Random) -> Problem:
    n = rng.randint(1000, 5000)
    k, d = rng.randint(n // 4, n // 2), rng.randint(6, 12)
    return Problem(
        "binomial_mod",
        f"What is the remainder when the binomial coefficient C({n}, {k}) is divided by 10^{d}?",
        Fraction(math.comb(n, k) % 10**d),
        f"import math\nprint(math.comb({n}, {k}) % 10**{d})",
    )


def _divisor_count(rng: random.Random) -> Problem:
    primes = [p for p in range(2, 200) if all(p % q for q in range(2, math.isqrt(p) + 1))]
    value, count = 1, 1
    for p in sorted(rng.sample(primes, rng.randint(3, 6))):
        e = rng.randint(1, 4)
        if value * p**e > 10**12:
            break
        value *= p**e
        count *= e + 1
    return Problem(
        "divisor_count",
        f"How many positive divisors does {value} have?",
        Fraction(count),
        f"n = {value}\nc, d = 1, 2\nwhile d * d <= n:\n    e = 0\n    while n % d == 0:\n"
        "        n //= d\n        e += 1\n    c *= e + 1\n    d += 1\n"
        "print(c * (2 if n > 1 else 1))",
    )


TEMPLATES: dict[str, Callable[[random.Random], Problem]] = {
    "modpow": _modpow,
    "factorial_digit_sum": _factorial_digits,
    "divisible_sum": _divisible_sum,
    "digit_sum_count": _digit_sum_count_problem,
    "subset_sums": _subset_sums,
    "power_sum": _power_sum,
    "fibonacci_mod": _fibonacci,
    "prime_count": _prime_count,
    "binomial_mod": _binomial,
    "divisor_count": _divisor_count,
}


# ---- answers ----------------------------------------------------------------------------------

_INTEGER = r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)"
_NUMBER = re.compile(rf"^(?P<int>{_INTEGER})(?:\.(?P<frac>\d+))?$")
_RATIO = re.compile(rf"^(?P<p>{_INTEGER})\s*/\s*(?P<q>{_INTEGER})$")
_LATEX_FRAC = re.compile(r"^(?P<sign>[+-]?)\\[dt]?frac\{(?P<p>[^{}]+)\}\{(?P<q>[^{}]+)\}$")
_WRAPPERS = (
    re.compile(r"^\\boxed\{(.*)\}$", re.DOTALL),
    re.compile(r"^\$+(.*?)\$+$", re.DOTALL),
    re.compile(r"^\\\((.*)\\\)$", re.DOTALL),
    re.compile(r"^\*\*(.*)\*\*$", re.DOTALL),
    re.compile(r"^`(.*)`$", re.DOTALL),
)


def parse_answer(text: str) -> Fraction | None:
    """The one number `text` states, or None (no number, several, an expression, words).

    Accepted: an integer (thousands separators allowed), a decimal, `p/q`, `\\frac{p}{q}`;
    optionally inside `\\boxed{}`, `$...$`, `\\(...\\)`, `**...**` or backticks, with a trailing
    period and surrounding spaces."""
    if len(text) > MAX_ANSWER_CHARS:
        return None
    value = text.strip()
    for _ in range(4):
        value = value.strip().rstrip(".").strip()
        for wrapper in _WRAPPERS:
            found = wrapper.match(value)
            if found:
                value = found.group(1)
                break
        else:
            break
    value = value.replace("\u2212", "-")
    return _number(value)


def _number(value: str) -> Fraction | None:
    latex = _LATEX_FRAC.match(value)
    if latex:
        p, q = _number(latex.group("p")), _number(latex.group("q"))
        if p is None or q is None or q == 0:
            return None
        return (-1 if latex.group("sign") == "-" else 1) * p / q
    ratio = _RATIO.match(value)
    if ratio:
        below = _integer(ratio.group("q"))
        return None if below == 0 else Fraction(_integer(ratio.group("p")), below)
    number = _NUMBER.match(value)
    if number:
        whole = number.group("int")
        frac = number.group("frac") or ""
        sign = -1 if whole.startswith("-") else 1
        magnitude = abs(_integer(whole))
        return sign * (magnitude + Fraction(int(frac or "0"), 10 ** len(frac)))
    return None


def _integer(text: str) -> int:
    return int(text.replace(",", ""))


def format_answer(value: Fraction) -> str:
    """`value` as we state it: an integer, or `p/q` in lowest terms."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value.numerator}/{value.denominator}"


# ---- the family -------------------------------------------------------------------------------


class MathOptions(BaseModel):
    """`tasks.options.math`.

    - `templates`: the problem templates to draw from (default all of `TEMPLATES`).
    - `python_timeout_s`: wall-clock limit of one `python` call (default 30).
    - `max_output_chars`: most characters of a `python` call's output shown (default 8000).
    """

    model_config = ConfigDict(extra="forbid")

    templates: list[str] = Field(default_factory=lambda: list(TEMPLATES))
    python_timeout_s: float = Field(DEFAULT_TIMEOUT_S, gt=0)
    max_output_chars: int = Field(DEFAULT_OUTPUT_CHARS, gt=0)

    @field_validator("templates")
    @classmethod
    def _known(cls, names: list[str]) -> list[str]:
        unknown = [name for name in names if name not in TEMPLATES]
        if unknown or not names:
            raise ValueError(
                f"unknown or no templates {unknown}; choose from {', '.join(TEMPLATES)}"
            )
        return list(dict.fromkeys(names))


def _system_prompt() -> str:
    run = format_tool_call(
        ToolCall(name="python", arguments={"code": "print(sum(k * k for k in range(1, 101)))"}),
        "hermes",
    )
    done = format_tool_call(ToolCall(name="finish", arguments={"answer": "338350"}), "hermes")
    return (
        "You solve math problems that have one exact numeric answer. You can run Python 3 code "
        "in a sandbox with the python tool (no network; each call is a fresh interpreter; the "
        "standard library, sympy and mpmath are available). Make one call per message and wait "
        "for the result. Call a tool exactly like this:\n"
        f"{run}\n"
        "Submit only the final number with finish: an integer, or a fraction p/q in lowest "
        "terms when the answer is not an integer, with no words or expressions:\n"
        f"{done}"
    )


SYSTEM_PROMPT = _system_prompt()


@register_family(options=MathOptions)
class MathFamily:
    """Generated exact-answer problems; tools `python` and `finish`; exact-match reward (see the
    module doc). Options: `MathOptions`."""

    name = "math"
    source = "generated"
    version = "1"
    splits = tuple(SPLIT_SHARES)
    runtimes: tuple[str, ...] = EXECUTOR_RUNTIMES

    def __init__(
        self, runtime: RuntimeConfig | None = None, services: FamilyServices | None = None
    ) -> None:
        self.runtime, self.runtime_kind = runtime_choice(self.name, runtime, self.runtimes)
        options = services.options if services is not None else {}
        self.options = family_options(self.name, MathOptions, options)

    def make_tasks(self, n: int, seed: int, split: str) -> list[Task]:
        """`n` distinct problems of `split`, deterministic in (n, seed, split, templates)."""
        names = self.options.templates

        def draw(rng: random.Random) -> tuple[str, Problem]:
            problem = TEMPLATES[rng.choice(names)](rng)
            return problem.question, problem

        problems = sample_instances(self.name, n, seed, split, draw)
        return [
            instance_task(
                self.name,
                split,
                index,
                opening(SYSTEM_PROMPT, problem.question),
                {
                    "template": problem.template,
                    "answer": format_answer(problem.answer),
                    "code": problem.code,
                },
            )
            for index, problem in enumerate(problems)
        ]

    def tools(self) -> ToolRegistry:
        """`python` and `finish`."""
        python = make_python_tool(self.options.python_timeout_s, self.options.max_output_chars)
        return ToolRegistry([python, finish])

    async def make_runtime(self, task: Task) -> Runtime:
        """A started executor sandbox over an empty workspace."""
        return await start_executor_runtime(self.runtime)

    async def score(self, task: Task, answer: str | None, runtime: Runtime) -> float:
        """1.0 if `answer` is exactly one number equal to the expected one, else 0.0."""
        if answer is None:
            return 0.0
        value = parse_answer(answer)
        return 1.0 if value is not None and value == Fraction(task.data["answer"]) else 0.0

    def oracle_calls(self, task: Task) -> list[ToolCall]:
        """Compute the answer with `python`, then submit it."""
        return [
            ToolCall(name="python", arguments={"code": task.data["code"]}),
            ToolCall(name="finish", arguments={"answer": task.data["answer"]}),
        ]
