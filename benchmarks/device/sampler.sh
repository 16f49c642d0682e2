#!/usr/bin/env bash
# The sampler under agent load (benchmarks/sampler.py) on a GPU machine, carrying .gpu/whl
# (transformers 5.24.0; see README.md). About 3-4 minutes on an H200; numbers go to $OUT/*.json.
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpu/whl/transformers-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
OUTD=${OUT:-/tmp/sampler_out}; mkdir -p "$OUTD"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
B="python3 benchmarks/sampler.py --device cuda --model random-smollm2 --turns 5 --prompt-len 1500 --obs-len 150 --new-tokens 20 100"
run() { name=$1; shift; echo "== $name: $*"; $B "$@" --json "$OUTD/$name.json" 2>&1 | grep -v "^Loading\|^Writing\|^{\|^}\|^  \""; }
run e64_sleep --episodes 64 --tool sleep --gap 0.5 2
run e64_process --episodes 64 --tool process --gap 1 3
run e64_sleep_prefix --episodes 64 --tool sleep --gap 0.5 2 --prefix-cache 65536
run e16_sleep --episodes 16 --tool sleep --gap 0.5 2
run e256_sleep --episodes 256 --tool sleep --gap 0.5 2
