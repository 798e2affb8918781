#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'EOF'
import re
text = open("stats").read()
fixed = re.sub(r"(def mean\(values\):\n)    return .*\n",
               r"\1    return sum(values) / len(values)\n", text)
open("stats", "w").write(fixed)
EOF
