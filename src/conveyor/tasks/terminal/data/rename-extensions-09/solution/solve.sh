#!/bin/bash
set -euo pipefail
cd /app
for f in notes/*.yml; do mv -- "$f" "${f%.yml}.yaml"; done
