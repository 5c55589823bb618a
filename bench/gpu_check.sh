#!/usr/bin/env bash
# The whole GPU check, on a lent GPU machine, in about ten minutes on an H200 (measured 2026-12-04: tests 145 s
# in one process, eval 15 s, embed about 300 s for both models, encode about 140 s; the tests now spread over 8
# CPUs with pytest-xdist, not yet timed there); run at once when a session's device status says a machine is lent
# (after bench/gpu_wheels.sh and `python bench/gpu_eval.py prepare .gpu_eval` here):
#
#   device run, carry [".whl", ".gpu_eval"], timeout 590:   bash bench/gpu_check.sh
#   ... or some steps only, in two calls that each leave device time for the other:
#                                                              bash bench/gpu_check.sh tests eval embed
#                                                              bash bench/gpu_check.sh encode
#
# In order of what matters most, each step under its own timeout:
# 1. the device's torch, torchvision, CUDA and driver;
# 2. the GPU tests with MIEB_REQUIRE_GPU=1 (a CUDA or torchvision test that would skip fails instead):
#    tests/system/test_cuda.py (bf16 and fp32 against the CPU, nvJPEG against the CPU path on mixed sizes, the
#    stream race, one Ray GPU actor end to end), tests/unit/encode/test_gpu_decode.py and test_model.py, and the
#    CPU path against the processor under the device's transformers and torchvision (test_preprocess.py and
#    test_equivalence.py);
# 3. bench/gpu_eval.py device: the eval's embeddings of fixture tasks of every type, exact (the default) and
#    --fast, made on the GPU (in one process: on 16 CPUs per GPU --fast decodes on the CPUs, as on Ray); scored
#    against mteb back here (`python bench/gpu_eval.py score`), then `python bench/gpu_records.py` and
#    `python bench/results.py` turn the logs into bench/records and bench/RESULTS.md;
# 4. bench/gpu_embed.py: `mieb-ray embed` on 100,000 photos of mixed sizes, B/32 and L/14, against the encoder
#    alone and the CPU decode ceiling, the other feed beside --decode auto's choice, the GPU's utilisation;
# 5. bench/gpu_encode.py: B/32 and L/14 in bf16 against timm's models of the same shapes and torch.compile,
#    images/s against the datasheet and the measured matmul bound.
# Everything it prints is also under $OUT; it exits non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 MIEB_REQUIRE_GPU=1 RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1 MIEB_NO_S3=1
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out" /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && tar xJf .whl/ray.tar.xz -C /tmp/site || { echo "gpu_check: install from .whl failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests PATH=/tmp/site/bin:$PATH
failed=()
wanted=" ${*:-versions tests eval embed encode} "
step() {  # step NAME COMMAND...: run it (when asked for), its output to the screen and $out/NAME.log
  [[ $1 == versions || $wanted == *" $1 "* ]] || return 0
  echo "== $1"
  local t0=$SECONDS
  "${@:2}" 2>&1 | tee "$out/$1.log"
  local rc=${PIPESTATUS[0]}
  echo "== $1: exit $rc in $((SECONDS - t0)) s"
  [ "$rc" = 0 ] || failed+=("$1")
}
step versions python3 -c "import torch, torchvision, transformers, ray
print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'torchvision', torchvision.__version__,
      'transformers', transformers.__version__, 'ray', ray.__version__)
print(torch.cuda.get_device_name(), open('/proc/driver/nvidia/version').read().split('\n')[0])"
# pytest-xdist (.whl) spreads the tests over 8 of the device's CPUs; -rP keeps what the passing tests print
par=(-s); python3 -c "import xdist" 2>/dev/null && par=(-n 8 -rP)
step tests timeout 220 python3 -m pytest -q -p no:cacheprovider -o addopts="" "${par[@]}" tests/system/test_cuda.py \
  tests/unit/encode/test_gpu_decode.py tests/unit/encode/test_model.py tests/unit/encode/test_preprocess.py \
  tests/unit/encode/test_equivalence.py
step eval timeout 60 python3 bench/gpu_eval.py device .gpu_eval "$out" --fast-executor local
step embed timeout 380 python3 bench/gpu_embed.py "$out" ${GPU_EMBED_MODELS:+--models "$GPU_EMBED_MODELS"}
step encode timeout 240 python3 bench/gpu_encode.py --seconds 2 --batch-sizes 512
echo "failed steps: ${failed[*]:-none}"
[ ${#failed[@]} = 0 ]
