#!/usr/bin/env bash
# Prints, one per line and sorted, the Debian packages that provide the shared libraries the
# given executables and libraries load (ldd). The Containerfile's build stage writes this
# list so its runtime stage installs exactly the runtime libraries and no -dev packages.
#
# Usage: runtime-packages.sh FILE... > runtime-packages.txt
#
# Libraries that no package owns are skipped: libcuda.so.1 comes from the host driver through
# the NVIDIA container runtime, and the project's own libraries are copied by the Containerfile.
set -euo pipefail

if [[ $# -eq 0 ]]; then
  echo "usage: $0 FILE..." >&2
  exit 2
fi

libs=()
for file in "$@"; do
  if [[ ! -e "$file" ]]; then
    echo "$0: no such file: $file" >&2
    exit 2
  fi
  # Lines look like "libfoo.so.1 => /lib/x86_64-linux-gnu/libfoo.so.1 (0x...)"; a static
  # executable has none (and ldd fails on it).
  while read -r lib; do
    libs+=("$lib")
  done < <({ ldd "$file" 2>/dev/null || true; } | awk '$2 == "=>" && $3 ~ /^\// { print $3 }')
done
if [[ ${#libs[@]} -eq 0 ]]; then
  exit 0
fi

# dpkg registers a file under the path its package shipped, while ldd prints the path the
# loader found; with Debian's merged /usr they differ by a leading /usr. Ask for both, in one
# dpkg-query call (each call reads the whole package database).
queries=()
for lib in "${libs[@]}"; do
  case "$lib" in
    /usr/*) queries+=("$lib" "${lib#/usr}") ;;
    *) queries+=("$lib" "/usr$lib") ;;
  esac
done

# Output lines: "pkg[:arch][, pkg2[:arch]]: /path"; paths nobody owns only go to stderr.
{ dpkg-query -S "${queries[@]}" 2>/dev/null || true; } |
  grep -v '^diversion ' |
  sed -n 's|^\([^/]*\): /.*$|\1|p' |
  tr ',' '\n' |
  sed 's/^ *//; s/:.*$//' |
  sed '/^$/d' |
  sort -u
