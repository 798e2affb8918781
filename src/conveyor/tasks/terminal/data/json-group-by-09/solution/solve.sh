#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'EOF'
import json
groups = {}
for p in json.load(open("people.json")):
    groups.setdefault(p["city"], []).append(p["name"])
json.dump({c: sorted(n) for c, n in groups.items()}, open("by_city.json", "w"))
EOF
