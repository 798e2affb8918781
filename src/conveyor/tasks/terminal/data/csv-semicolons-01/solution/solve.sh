#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'EOF'
import csv
rows = [line.rstrip("\n").split(";") for line in open("data.csv") if line.strip()]
with open("fixed.csv", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(rows[0])
    for item, price, qty in rows[1:]:
        w.writerow([item, price.replace(",", "."), qty])
EOF
