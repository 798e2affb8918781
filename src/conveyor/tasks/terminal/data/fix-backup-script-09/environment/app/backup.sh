#!/bin/bash
# Copy every *.conf file of SRC (not its sub-folders) into DEST, creating DEST if needed.
set -e
SRC="$1"
DEST="$2"
cp "$SRC"/*.cnf "$DEST"/
