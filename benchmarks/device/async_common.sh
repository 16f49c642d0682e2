# sourced after common.sh by async_setup.sh and async_run.sh: the run every arm of benchmarks/async.py branches from.
# A small warm start (16 expert episodes) so that episodes look like a trained agent's (read, edit, test, finish);
# 32 rollouts a step (4 tasks x 8 samples) with all 32 episodes in flight at once.
FIRST=${FIRST:-$RUNS/first}
MODEL=${MODEL:-smollm2}
AOVR=${AOVR:-"run_dir=$FIRST model.path=$MODEL model.device=${DEVICE:-cuda:0} engine.kind=hf sandbox.backend=local \
micro.warm_start_repos=6 micro.rl_repos=4 micro.eval_repos=1 micro.templates=[] warm_start.episodes=16 eval.samples_per_task=1 \
rollout.group_size=8 rollout.tasks_per_step=4 rollout.concurrency=32 rl.steps=0 $XOVR"}
