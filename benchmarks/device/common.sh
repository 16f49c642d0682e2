# sourced by setup.sh and run.sh: paths and the GPU run's overrides (shared by prebuild and the run)
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
PY=${PY:-python3}
SITE=${SITE:-/tmp/site}
RUNS=${RUNS:-/tmp/gpu_runs}
OUTD=${OUT:-/tmp/gpu_out}; mkdir -p "$OUTD"
export PYTHONPATH=$SITE:$PWD OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} PYTHONUNBUFFERED=1
SEEDS=${SEEDS:-"2 3 4"}
ARM=grpo+errcost+kl
OVR=${OVR:-"model.device=cuda:0 engine.kind=hf sandbox.backend=local rollout.group_size=8 rollout.tasks_per_step=8 rollout.concurrency=64 eval.samples_per_task=8 micro.rl_repos=8 rl.steps=30"}
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
