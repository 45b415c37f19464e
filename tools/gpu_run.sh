#!/usr/bin/env bash
# One prepared run on a lent GPU machine (docs/gpu.md, "First run on a GPU machine"): the parts
# named on the command line, in that order, each under its own time limit, each part's output
# into $OUT/<part>.log (omni-ahead: omni_ahead.log; ray also writes ray_gpu.log; the device tool
# returns $OUT even when the call runs out of time).
#
#   bash tools/gpu_run.sh cuda suite decode host omni   # after the device-wheels prefix
#   bash tools/gpu_run.sh cuda+suite omni               # cuda and suite at the same time
#
# Parts: cuda (the `cuda` tests, in one process), suite (the rest but Ray, 12 workers),
# decode (bench/gpu.py's decoder parts with the profiler), host (bench/host_step.py), fused
# (bench/fused_kernels.py: fused layers against transformers' at B=16, and against
# torch.compile), sampler (bench/sampler.py), split
# (bench/split_kv.py: the attention's keys split over programs or not, per layer), omni
# (bench/gpu.py's Qwen2.5-Omni 7B parts), omni-ahead (the same, thinker and talker steps
# launched ahead, transformers' side skipped), qwen3 (bench/gpu.py --family qwen3_omni_moe, cut to
# 24 thinker layers), qwen3-ahead (the same, both stages launched ahead; qwen3_ahead.log),
# vocoder (the omni part without transformers' side, with --t2w-ramp 20,40, then with
# --t2w-batch 16: vocoder_ramp.log, vocoder_batch.log; compare with the omni part's gaps),
# ray (the `ray` tests, then tools/ray_gpu_check.py: stages on Ray with the
# GPU split; needs Ray's three parts, tools/ray_parts.sh: each call stashes the part it carries
# under /tmp/rayparts, and this part installs Ray from them). Set LIMIT_<part>=seconds to change a part's limit; PYTEST_ARGS adds
# arguments to the suite's pytest (e.g. a list of test files).
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv >"$out/gpu.txt" 2>&1
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton",
triton.__version__, "transformers", transformers.__version__)' >>"$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
for d in .rayp1 .rayp2 .rayp3; do  # Ray's wheel, a part per call (tools/ray_parts.sh)
  if [ -d "$d" ]; then mkdir -p /tmp/rayparts && cp "$d"/* /tmp/rayparts/; fi
done
ls /tmp/rayparts 2>/dev/null | tr '\n' ' ' | sed 's/^/ray parts stashed: /; s/$/\n/'

install_ray() {
  python3 -c 'import ray' 2>/dev/null && return 0
  local parts=(/tmp/rayparts/part00 /tmp/rayparts/part01 /tmp/rayparts/part02)
  for p in "${parts[@]}" /tmp/rayparts/NAME; do
    [ -f "$p" ] || { echo "ray: $p missing (carry .rayp1, .rayp2, .rayp3 in three calls in a row)"; return 1; }
  done
  local wheel
  wheel=/tmp/$(cat /tmp/rayparts/NAME)
  cat "${parts[@]}" >"$wheel" && python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --target /tmp/site "$wheel" && python3 -c 'import ray; print("ray", ray.__version__)'
}

run_part() {
  local part=$1 limit=$2
  shift 2
  local var="LIMIT_${part}"
  limit=${!var:-$limit}
  local start=$SECONDS
  echo "== $part (limit ${limit}s): $*"
  # SIGINT first: pytest then stops like ^C and still prints its failures and summary (a part
  # killed outright loses them), and the benches print what they measured so far.
  timeout -s INT --kill-after=20 "$limit" "$@" >"$out/$part.log" 2>&1
  local rc=$?
  echo "== $part: exit $rc after $((SECONDS - start))s"
  tail -n 25 "$out/$part.log"
}

run_one() {
  local part=$1
  case $part in
  suite) run_part suite 300 python3 -m pytest -q -n 12 -m "not ray and not cuda" -rfE \
    --tb=short -p no:cacheprovider --timeout 120 --junitxml "$out/suite.xml" \
    ${PYTEST_ARGS:-tests/} ;;
  # One process: each cuda test sizes its pools from the GPU's free memory (tests/conftest.py).
  cuda) run_part cuda 300 python3 -m pytest -q -m cuda -rfE --tb=short -p no:cacheprovider \
    --timeout 120 --junitxml "$out/cuda.xml" ${PYTEST_ARGS:-tests/} ;;
  decode) run_part decode 300 python3 bench/gpu.py --profile --profile-batch 16,64 --skip hf --skip omni \
    --skip hf-static --decode-batch 16,64 --decode-tokens 64 --prefix-requests 3 ;;
  host) run_part host 60 python3 bench/host_step.py --batch 16,64 ;;
  # Fused Triton kernels against transformers' modules, eager and replayed (issue 20 item 2).
  # With transformers' modules under torch.compile beside them (the alternative, item 2).
  fused) run_part fused 240 python3 bench/fused_kernels.py --batch 16 --context 512 --compile ;;
  # Sampled rows (omni/runtime/sampler.py) against transformers' warpers, bf16 logits.
  sampler) run_part sampler 60 python3 bench/sampler.py --batch 16,64 ;;
  # The attention with and without its keys split (kernels/split_kv.py), graph-replayed.
  split) run_part split 120 python3 bench/split_kv.py ;;
  omni) run_part omni 330 python3 bench/gpu.py --skip decode --skip prefix --skip steps \
    --hf-requests 2 --single 2 --requests 16 --warmup 1 ;;
  # The vocoder's two open questions (docs/streaming.md, "Playback gaps"): a ramp of chunks
  # after the first (the gap after the first audio), then one step for 16 streams (16 at once).
  vocoder)
    run_part vocoder_ramp 180 python3 bench/gpu.py --skip decode --skip prefix --skip steps \
      --skip hf --single 2 --requests 16 --warmup 1 --t2w-ramp 20,40
    run_part vocoder_batch 180 python3 bench/gpu.py --skip decode --skip prefix --skip steps \
      --skip hf --single 2 --requests 16 --warmup 1 --t2w-batch 16 ;;
  # The same with the thinker's and talker's steps launched ahead (engine.async_scheduling).
  omni-ahead) run_part omni_ahead 330 python3 bench/gpu.py --skip decode --skip prefix \
    --skip steps --skip hf --single 2 --requests 16 --warmup 1 --ahead ;;
  ray)
    export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
    install_ray || return
    run_part ray 300 python3 -m pytest -q -m ray -n 4 -rfE --tb=short -p no:cacheprovider \
      --timeout 180 --junitxml "$out/ray.xml" tests/
    run_part ray_gpu 120 python3 tools/ray_gpu_check.py ;;
  qwen3) run_part qwen3 420 python3 bench/gpu.py --family qwen3_omni_moe --layers 24 \
    --hf-requests 2 --single 2 --warmup 1 ;;
  # The same with both stages' steps launched ahead, transformers' side skipped.
  qwen3-ahead) run_part qwen3_ahead 420 python3 bench/gpu.py --family qwen3_omni_moe \
    --layers 24 --skip hf --single 2 --warmup 1 --ahead ;;
  *) echo "unknown part: $part" >&2 ;;
  esac
}

# Parts joined by "+" run at the same time (e.g. cuda+suite: the suite's tests are pinned to the
# CPU, so they do not compete for the GPU memory the cuda tests size their pools from).
for group in "$@"; do
  IFS=+ read -ra parts <<<"$group"
  for part in "${parts[@]}"; do run_one "$part" & done
  wait
done
