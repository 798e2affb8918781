"""A tiny Django-style project placed in the SWE cache: its tests run through its own
`tests/runtests.py` (Django's test runner at verbosity 2, as Django's repository runs its
suite), and the row is graded with swebench's `parse_log_django`, as a django/django row is."""

from __future__ import annotations

from tiny_project import write_source

from conveyor.tasks.swe.dataset import RowEnvironment, SweRow
from conveyor.tasks.swe.patches import file_diff

NAME = "conveyor-tinydj"
VERSION = "1.0"
DJANGO = "django==5.2.19"

PRICING = '''"""Prices."""


def discounted(price, percent):
    """`price` less `percent` per cent, never below zero."""
    return max(price - price * percent / 100, 0)


def total(prices):
    """Sum of the prices."""
    return sum(prices)
'''

RUNTESTS = '''#!/usr/bin/env python
"""Run the test suite with Django's runner, as Django's own tests/runtests.py does."""
import argparse
import os
import sys

import django
from django.conf import settings
from django.test.utils import get_runner

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
parser = argparse.ArgumentParser()
parser.add_argument("labels", nargs="*")
parser.add_argument("--verbosity", type=int, default=1)
parser.add_argument("--parallel", type=int, default=1)
args = parser.parse_args()
settings.configure(
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    INSTALLED_APPS=[],
    USE_TZ=True,
)
django.setup()
runner = get_runner(settings)(verbosity=args.verbosity, parallel=args.parallel, top_level=HERE)
failures = runner.run_tests(args.labels or ["test_pricing"])
sys.exit(bool(failures))
'''

TESTS = """from django.test import SimpleTestCase

from shop.pricing import discounted, total


class PricingTests(SimpleTestCase):
    def test_discounted(self):
        self.assertEqual(discounted(200, 10), 180)

    def test_total(self):
        self.assertEqual(total([1, 2, 3]), 6)
"""

HIDDEN = """from django.test import SimpleTestCase

from shop.pricing import discounted


class HiddenTests(SimpleTestCase):
    def test_never_negative(self):
        self.assertEqual(discounted(10, 150), 0)

    def test_half(self):
        self.assertEqual(discounted(50, 50), 25)
"""

EVAL_SCRIPT = """#!/bin/bash
set -uxo pipefail
cd /testbed
: '>>>>> Start Test Output'
python tests/runtests.py --verbosity 2 --parallel 1 test_pricing test_hidden
: '>>>>> End Test Output'
"""


def buggy_pricing() -> str:
    """The bug: the discount is added, not taken off."""
    return PRICING.replace("price - price * percent", "price + price * percent")


def test_id(module: str, cls: str, name: str) -> str:
    """A test's name as Django's runner prints it at verbosity 2 (Python >= 3.11)."""
    return f"{name} ({module}.{cls}.{name})"


def django_row(instance_id: str = "tinydj__discount_bug") -> SweRow:
    """A Django-style row: F2P and P2P named as Django's runner prints them, the test command
    in a swebench 5 `eval_script`, `log_parser: parse_log_django`."""
    write_source(
        NAME,
        VERSION,
        {
            "shop/__init__.py": "",
            "shop/pricing.py": PRICING,
            "tests/runtests.py": RUNTESTS,
            "tests/test_pricing.py": TESTS,
            "README.md": "tiny django-style project\n",
        },
    )
    return SweRow(
        instance_id=instance_id,
        repo=f"pypi:{NAME}",
        version=VERSION,
        problem_statement="discounted() raises the price instead of lowering it.",
        patch=file_diff("shop/pricing.py", buggy_pricing(), PRICING),
        test_patch=file_diff("tests/test_hidden.py", None, HIDDEN),
        FAIL_TO_PASS=[
            test_id("test_pricing", "PricingTests", "test_discounted"),
            test_id("test_hidden", "HiddenTests", "test_half"),
            test_id("test_hidden", "HiddenTests", "test_never_negative"),
        ],
        PASS_TO_PASS=[test_id("test_pricing", "PricingTests", "test_total")],
        environment=RowEnvironment(
            extra_test_deps=[DJANGO],
            setup_patch=file_diff("shop/pricing.py", PRICING, buggy_pricing()),
        ),
        eval_script=EVAL_SCRIPT,
        log_parser="parse_log_django",
    )
