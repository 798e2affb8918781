#!/bin/bash
set -euo pipefail
cd /app
for f in docs/*.log; do mv -- "$f" "${f%.log}.txt"; done
