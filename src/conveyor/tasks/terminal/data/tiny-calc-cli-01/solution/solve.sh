#!/bin/bash
set -euo pipefail
cd /app
cat > arith.py <<'EOF'
import sys
OPS = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b,
        "times": lambda a, b: a * b}
if len(sys.argv) != 4 or sys.argv[1] not in OPS:
    print("usage: OP A B", file=sys.stderr)
    sys.exit(2)
print(OPS[sys.argv[1]](int(sys.argv[2]), int(sys.argv[3])))
EOF
