#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'EOF'
import json
from collections import Counter
counts = Counter()
for line in open("app.log"):
    parts = line.split()
    if len(parts) >= 3 and parts[1] == "ERROR":
        counts[parts[2].rstrip(":")] += 1
json.dump(dict(counts), open("error_counts.json", "w"))
EOF
