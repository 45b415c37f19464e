#!/usr/bin/env bash
# Ray's wheel (79 MB) for the lent GPU machine, in three parts: a device call carries at most
# 64 MiB with the tree, and .whl/ (transformers, the server extras, the test plugins) takes ~33
# MB of that, so each of three calls in a row carries one part beside .whl/. tools/gpu_run.sh
# stashes whatever part a call carries under /tmp/rayparts (the machine keeps /tmp while it stays
# warm, 30 s after each call), and its `ray` part joins them and installs Ray there.
#
#   tools/ray_parts.sh          # here, with network, after ../shared/tools/device-wheels.sh
#   call 1: carry [".whl", ".rayp1"]  <prefix> bash tools/gpu_run.sh cuda+suite
#   call 2: carry [".whl", ".rayp2"]  <prefix> bash tools/gpu_run.sh omni
#   call 3: carry [".whl", ".rayp3"]  <prefix> bash tools/gpu_run.sh ray decode
set -euo pipefail
top=$(git rev-parse --show-toplevel)
cd "$top"
exclude=$(git rev-parse --git-path info/exclude)
for d in /.rayp1/ /.rayp2/ /.rayp3/; do grep -qx "$d" "$exclude" 2>/dev/null || echo "$d" >>"$exclude"; done
pin=$(grep -E '^ray==' constraints.txt | head -n 1)
[ -n "$pin" ] || { echo "constraints.txt pins no ray version" >&2; exit 1; }
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 "$@"
}
tmp=$(mktemp -d)
download -d "$tmp" "$pin"
mkdir -p .whl
# Ray's imports, at constraints.txt's versions (the test wheels of docs/gpu.md name the same)
download -d .whl $(grep -E '^(jsonschema|jsonschema-specifications|referencing|rpds-py)==' constraints.txt)
whl=$(ls "$tmp"/ray-*.whl)
rm -rf .rayp1 .rayp2 .rayp3 && mkdir -p .rayp1 .rayp2 .rayp3
split -n 3 -d "$whl" "$tmp/part"
mv "$tmp/part00" .rayp1/ && mv "$tmp/part01" .rayp2/ && mv "$tmp/part02" .rayp3/
basename "$whl" >.rayp3/NAME
rm -rf "$tmp"
du -sh .whl .rayp1 .rayp2 .rayp3
echo "each call: .whl plus one part, with the tree: must stay under 64 MiB"
