#!/bin/bash
set -euo pipefail
cd /app
cat > backup.sh <<'EOF'
#!/bin/bash
set -e
mkdir -p "$2"
cp "$1"/*.conf "$2"/
EOF
