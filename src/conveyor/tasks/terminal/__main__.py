"""`python -m conveyor.tasks.terminal OUT [FIRST VARIANTS]`: write the chores' task folders
under `OUT` (all variants, or `VARIANTS` of them from `FIRST`).

Here rather than in `chores`, which the package imports: running a module the package has
already imported would execute a second copy of it.
"""

import sys
from pathlib import Path

from conveyor.tasks.terminal.chores import VARIANTS, write_folders

first, count = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (0, VARIANTS)
write_folders(Path(sys.argv[1]), variants=count, first=first)
