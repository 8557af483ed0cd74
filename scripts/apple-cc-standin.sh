#!/usr/bin/env bash
# Stand-in C/C++ compiler for `cargo check --target aarch64-apple-darwin` on
# Linux: writes an empty file wherever an object is asked for. Type-checking
# Rust never links, so the objects are never read. When the cc crate asks
# which compiler family this is (a preprocess of a probe file, no output
# file), it answers clang, as Apple's compiler would.
out=""
for arg in "$@"; do
  case "$arg" in
    --version|-v) echo "apple-cc-standin (empty objects for cargo check)"; exit 0 ;;
    # MSVC's help flag: answering it would make cc take us for cl.exe.
    "-?") exit 1 ;;
  esac
done
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out=$2; shift 2 ;;
    -o*) out=${1#-o}; shift ;;
    *) shift ;;
  esac
done
if [ -n "$out" ]; then
  : > "$out"
else
  echo '#pragma message "clang"'
  echo '#pragma message "gcc"'
fi
exit 0
