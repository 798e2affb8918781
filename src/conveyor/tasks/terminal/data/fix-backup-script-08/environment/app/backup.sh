#!/bin/bash
# Copy every *.cfg file of SRC (not its sub-folders) into DEST, creating DEST if needed.
set -e
SRC="$1"
DEST="$2"
cp "$SRC"/*.cgf "$DEST"/
