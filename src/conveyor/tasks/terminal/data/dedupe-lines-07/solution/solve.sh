#!/bin/bash
set -euo pipefail
cd /app
awk '!seen[$0]++' contacts.txt > deduped.txt
