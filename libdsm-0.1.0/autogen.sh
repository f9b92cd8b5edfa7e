#!/bin/sh
# Generate configure and the Makefile templates (needs autoconf, automake, libtool).
set -e
cd "$(dirname "$0")"
mkdir -p m4 build-aux
autoreconf --force --install --warnings=all
