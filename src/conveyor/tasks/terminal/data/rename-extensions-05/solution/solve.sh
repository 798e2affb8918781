#!/bin/bash
set -euo pipefail
cd /app
for f in notes/*.jpeg; do mv -- "$f" "${f%.jpeg}.jpg"; done
