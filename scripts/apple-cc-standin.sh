#!/usr/bin/env bash
# Stand-in C/C++ compiler for `cargo check --target aarch64-apple-darwin` on
# Linux: writes an empty file wherever an object is asked for. Type-checking
# Rust never links, so the objects are never read.
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out=$2; shift 2 ;;
    -o*) out=${1#-o}; shift ;;
    --version|-v) echo "apple-cc-standin (empty objects for cargo check)"; exit 0 ;;
    *) shift ;;
  esac
done
[ -n "$out" ] && : > "$out"
exit 0
