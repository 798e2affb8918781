#!/bin/bash
set -euo pipefail
cd /app
for f in docs/*.yml; do mv -- "$f" "${f%.yml}.yaml"; done
