#!/bin/bash
set -euo pipefail
cd /app
for f in inbox/*.log; do mv -- "$f" "${f%.log}.txt"; done
