#!/bin/bash
set -euo pipefail
cd /app
for f in inbox/*.yml; do mv -- "$f" "${f%.yml}.yaml"; done
