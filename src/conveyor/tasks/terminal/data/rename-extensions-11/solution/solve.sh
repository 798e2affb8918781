#!/bin/bash
set -euo pipefail
cd /app
for f in docs/*.txt; do mv -- "$f" "${f%.txt}.md"; done
