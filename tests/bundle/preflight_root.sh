#!/usr/bin/env bash
# Proves, without a GPU, that a bundle's check.sh runs on another OS root up to the point where
# it looks for a GPU and stops there with a clear message, or stops earlier with a clear
# message when that root's glibc is older than the bundle's REQUIRES says. The roots are made
# with the distributions' own tools (debootstrap), never downloaded images.
#
#   tests/bundle/preflight_root.sh [--make SUITE DIR]... BUNDLE ROOT...
#
#   --make SUITE DIR   first make DIR with `debootstrap --variant=minbase SUITE DIR MIRROR`
#                      (MIRROR: $DEBIAN_MIRROR, else the first deb.debian.org-style URI of
#                      /etc/apt/sources.list*); skipped when DIR already has /usr/bin/ldd
#   BUNDLE             a folder made by ./scripts/bundle (bin/, lib/, check.sh, REQUIRES)
#   ROOT               a root file system to chroot into (needs bash, coreutils, grep, sed, ldd)
#
# For each ROOT: copies BUNDLE to ROOT/tmp/stash-bundle, mounts /proc there (unmounted after),
# asks the bundle's launcher there which C++ runtime it picks (./run --runtime: the root's own
# libstdc++/libgcc_s, or the bundle's lib/fallback/), runs its check.sh there under chroot with a
# clean environment and no nvidia-smi, and expects exit status 1 with one of:
#   - "no GPU found" after "binaries load": the root's glibc is new enough for that runtime,
#     every binary the preflight starts loaded with it, and the check stopped where it looks for
#     a GPU;
#   - "glibc X.Y is older than" REQUIRES' glibc: the root is older than the bundle supports;
#   - "glibc X.Y is older than" REQUIRES' glibc-fallback: the root's own libstdc++ lacks a
#     version the bundle needs, and its glibc is too old for the bundle's lib/fallback/.
# Prints one verdict line per root ("ROOT: glibc X.Y, runtime R: ran to the GPU lookup" or
# "...: stopped at the glibc preflight" / "...: stopped at the C++ runtime preflight") and exits
# 0 when every root gave the outcome its glibc and runtime call for, 1 otherwise. Needs root
# (chroot). Exit status 77 (skip) when not run as root.
set -euo pipefail

die() {
  echo "preflight_root: $*" >&2
  exit 1
}

if [[ $(id -u) -ne 0 ]]; then
  echo "preflight_root: needs root (chroot, debootstrap): skipped" >&2
  exit 77
fi

mirror() {
  if [[ -n "${DEBIAN_MIRROR:-}" ]]; then
    echo "$DEBIAN_MIRROR"
    return
  fi
  local uri
  uri="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null |
    grep -oE 'https?://[^ ]+/debian/?( |$)' | grep -v security | head -n 1 | tr -d ' ')"
  [[ -n "$uri" ]] || die "no Debian mirror in /etc/apt/sources.list*: set DEBIAN_MIRROR"
  echo "$uri"
}

while [[ "${1:-}" == --make ]]; do
  [[ $# -ge 3 ]] || die "--make needs SUITE and DIR"
  suite="$2" dir="$3"
  shift 3
  if [[ -x "$dir/usr/bin/ldd" ]]; then
    echo "preflight_root: $dir exists (made earlier), not made again"
    continue
  fi
  command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install debootstrap"
  echo "preflight_root: debootstrap --variant=minbase $suite $dir $(mirror)"
  debootstrap --variant=minbase "$suite" "$dir" "$(mirror)" >"$dir.debootstrap.log" 2>&1 ||
    die "debootstrap of $suite failed: see $dir.debootstrap.log"
done

[[ $# -ge 2 ]] || die "usage: $0 [--make SUITE DIR]... BUNDLE ROOT..."
bundle="$(realpath -- "$1")"
shift
[[ -f "$bundle/check.sh" && -f "$bundle/REQUIRES" && -d "$bundle/bin" ]] ||
  die "$bundle is not a bundle with check.sh and REQUIRES: make one with ./scripts/bundle"
need_glibc="$(sed -n 's/^glibc //p' "$bundle/REQUIRES")"
need_fallback="$(sed -n 's/^glibc-fallback //p' "$bundle/REQUIRES")"

# Whether version $1 is older than $2 (x.y).
older() { [[ "$1" != "$2" && "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n 1)" == "$1" ]]; }

failed=0
for root in "$@"; do
  root="$(realpath -- "$root")"
  [[ -x "$root/usr/bin/ldd" && -x "$root/bin/bash" ]] || die "$root is not a root file system with bash and ldd"
  glibc="$(chroot "$root" /usr/bin/ldd --version 2>&1 | sed -n 1p | grep -o '[0-9]\+\.[0-9]\+$')"
  name="$(sed -n 's/^PRETTY_NAME="\(.*\)"/\1/p' "$root/etc/os-release" 2>/dev/null)"
  rm -rf "$root/tmp/stash-bundle" "$root/tmp/stash-check-out"
  cp -a "$bundle" "$root/tmp/stash-bundle"
  # /proc, as on any node: the loader resolves $ORIGIN in the bundle's RUNPATH through
  # /proc/self/exe, and check.sh reads /proc/<pid>/stat.
  mounted=""
  if ! mountpoint -q "$root/proc"; then
    mount -t proc proc "$root/proc"
    mounted="$root/proc"
  fi
  set +e
  runtime=node
  if [[ -x "$bundle/run" ]]; then
    runtime="$(chroot "$root" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin \
      /bin/bash /tmp/stash-bundle/run --runtime 2>/dev/null | sed -n '1s/:.*//p')"
  fi
  output="$(chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/tmp OUT=/tmp/stash-check-out /bin/bash /tmp/stash-bundle/check.sh 2>&1)"
  code=$?
  set -e
  if [[ -n "$mounted" ]]; then umount "$mounted"; fi
  echo "---- $root (${name:-?}, glibc $glibc, C++ runtime ${runtime:-?}): check.sh exit $code"
  printf '%s\n' "$output" | sed 's/^/   | /'
  if older "$glibc" "$need_glibc"; then
    want="stopped at the glibc preflight"
    ok=0
    if [[ $code -eq 1 ]] && grep -q "glibc $glibc is older than $need_glibc" <<<"$output" &&
      ! grep -q '^== ' <<<"$output"; then ok=1; fi
  elif [[ "$runtime" == fallback && -n "$need_fallback" ]] && older "$glibc" "$need_fallback"; then
    want="stopped at the C++ runtime preflight"
    ok=0
    if [[ $code -eq 1 ]] &&
      grep -q "glibc $glibc is older than $need_fallback, which the bundle's own C++ runtime" <<<"$output" &&
      ! grep -q '^== ' <<<"$output"; then ok=1; fi
  else
    want="ran to the GPU lookup"
    ok=0
    if [[ $code -eq 1 ]] && grep -q '^binaries load: stashd ' <<<"$output" &&
      grep -q 'no GPU found' <<<"$output" && ! grep -q '^== ' <<<"$output"; then ok=1; fi
  fi
  if [[ $ok -eq 1 ]]; then
    echo "$root: ${name:-?}, glibc $glibc, C++ runtime ${runtime:-?} (bundle needs $need_glibc," \
      "${need_fallback:-$need_glibc} with lib/fallback/): $want, as expected"
  else
    echo "$root: ${name:-?}, glibc $glibc, C++ runtime ${runtime:-?} (bundle needs $need_glibc," \
      "${need_fallback:-$need_glibc} with lib/fallback/): expected \"$want\"; it did not"
    failed=1
  fi
  rm -rf "$root/tmp/stash-bundle" "$root/tmp/stash-check-out"
done
exit "$failed"
