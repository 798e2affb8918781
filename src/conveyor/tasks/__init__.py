"""Task families: generated task instances with their tools, runtimes, scorers and oracles.

Importing this package registers the built-in families (`arithmetic`, `filenav`).
"""

from conveyor.tasks.arithmetic import ArithmeticFamily
from conveyor.tasks.family import (
    SPLIT_SHARES,
    TaskFamily,
    build_families,
    get_family,
    register_family,
)
from conveyor.tasks.filenav import FileNavFamily

__all__ = [
    "SPLIT_SHARES",
    "ArithmeticFamily",
    "FileNavFamily",
    "TaskFamily",
    "build_families",
    "get_family",
    "register_family",
]
