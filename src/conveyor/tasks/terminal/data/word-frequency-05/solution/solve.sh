#!/bin/bash
set -euo pipefail
cd /app
tr -cs 'A-Za-z' '\n' < text.txt | tr 'A-Z' 'a-z' | grep -v '^$' | sort | uniq -c \
  | sort -k1,1nr -k2,2 | head -n 4 | awk '{print $2, $1}' > top.txt
