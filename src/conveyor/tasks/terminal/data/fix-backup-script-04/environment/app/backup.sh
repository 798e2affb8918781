#!/bin/bash
# Copy every *.ini file of SRC (not its sub-folders) into DEST, creating DEST if needed.
set -e
SRC="$1"
DEST="$2"
cp "$SRC"/*.inf "$DEST"/
