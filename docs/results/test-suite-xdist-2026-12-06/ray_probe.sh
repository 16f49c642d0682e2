#!/bin/bash
# Does a bare ray.init(num_cpus=2) in one process join a ray.cluster_utils.Cluster another process runs?
cd /work/main
.venv/bin/python -c "
from ray import cluster_utils; import time
c = cluster_utils.Cluster(initialize_head=True, head_node_args={'num_cpus': 0, 'include_dashboard': False})
print('cluster up', c.address, flush=True); time.sleep(45); c.shutdown(); print('cluster down', flush=True)" &
sleep 20
for addr in None '"local"'; do
  .venv/bin/python -c "
import ray
try:
    ray.init(address=$addr, num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    print('address=$addr: own cluster?', ray.get_runtime_context().gcs_address, flush=True); ray.shutdown()
except Exception as e:
    print('address=$addr:', type(e).__name__, str(e)[:200], flush=True)
"
done
wait
