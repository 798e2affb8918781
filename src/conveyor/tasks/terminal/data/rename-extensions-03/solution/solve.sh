#!/bin/bash
set -euo pipefail
cd /app
for f in inbox/*.jpeg; do mv -- "$f" "${f%.jpeg}.jpg"; done
