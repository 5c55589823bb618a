#!/usr/bin/env bash
# Prepare, on this machine, what bench/gpu_check.sh needs on a lent GPU machine that lacks it: wheels for
# Python 3.12 (the device's), in .whl/ (ignored by git, carried by the device tool; at most 64 MiB).
#
# The device image has torch, torchvision, transformers, pyarrow, fsspec, Pillow, numpy, pandas and pytest. Ray's
# wheel is 79 MB, over the carry limit, so its files travel as an xz tarball without what the GPU check never
# imports (Java jars, RLlib, Serve, the LLM library): 26 MB.
#
#   bench/gpu_wheels.sh            # then run the device tool with carry [".whl"] and bench/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
get() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "$@"
}
get simplejpeg==1.9.0 webdataset==1.0.2 braceexpand==0.1.7 jsonschema==4.25.1 jsonschema-specifications==2025.9.1 \
    referencing==0.36.2 rpds-py==0.30.0 pytest-xdist==3.8.0 execnet==2.1.2
work=$(mktemp -d)
get -d "$work" ray==2.60.0
(cd "$work" && unzip -q ray-*.whl && rm -rf ray-*.whl ray/jars ray/rllib ray/serve ray/llm \
  && tar cf - ray ray-*.dist-info | xz -9 -T0 > ray.tar.xz)
mv "$work/ray.tar.xz" .whl/ && rm -rf "$work"
du -sh .whl && ls .whl
