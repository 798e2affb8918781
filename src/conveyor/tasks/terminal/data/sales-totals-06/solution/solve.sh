#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'EOF'
import csv
from decimal import Decimal
totals = {}
for row in csv.DictReader(open("sales.csv")):
    totals[row["region"]] = totals.get(row["region"], Decimal(0)) + Decimal(row["amount"])
with open("totals.csv", "w") as f:
    f.write("region,total\n")
    for region in sorted(totals):
        f.write(f"{region},{totals[region]:.2f}\n")
EOF
