#!/bin/bash
set -euo pipefail
cd /app
awk '!seen[$0]++' emails.txt > unique.txt
