#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'EOF'
merged = {}
for name in ("defaults.env", "override.env"):
    for line in open(name):
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            merged[key] = value
open("final.env", "w").write("".join(f"{k}={merged[k]}\n" for k in sorted(merged)))
EOF
