#!/usr/bin/env bash
# Adds NVIDIA's CUDA apt repository for Debian 12 (the cuda-keyring package: signing key plus
# sources entry) and refreshes the package lists. Debian itself ships no CUDA 12 toolkit.
# Needs curl and ca-certificates; run as root inside the Containerfile's stages.
set -euo pipefail

case "$(dpkg --print-architecture)" in
  amd64) repo_arch=x86_64 ;;
  arm64) repo_arch=sbsa ;;   # Grace Hopper and other server Arm
  *)
    echo "add-cuda-apt-repo.sh: no CUDA repository for $(dpkg --print-architecture)" >&2
    exit 1
    ;;
esac

keyring_deb=$(mktemp --suffix=.deb)
trap 'rm -f "$keyring_deb"' EXIT
repo=https://developer.download.nvidia.com/compute/cuda/repos/debian12/$repo_arch
curl -fsSL -o "$keyring_deb" "$repo/cuda-keyring_1.1-1_all.deb"
dpkg -i "$keyring_deb"
apt-get update
