"""RayWorkers on a Ray cluster of several nodes (ray.cluster_utils.Cluster: separate raylets on this
machine, the way Ray tests its own multi-node scheduling): the actors spread over the nodes, and
losing a node mid-run loses no episode."""

import os
import time
from concurrent.futures import wait
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

from carl.rollout.workers import RayWorkers  # noqa: E402


class SleepyEpisodes:
    """A spec whose episodes sleep, then say where they ran: (node id, pid, task, sample, version)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def runner(self):
        def run(task_index, sample_index, version):
            time.sleep(self.seconds)
            return ray.get_runtime_context().get_node_id(), os.getpid(), task_index, sample_index, version

        return run


@pytest.fixture
def cluster(monkeypatch):
    # the nodes' worker processes import this module to unpickle the spec
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    # the head takes no actor (0 CPUs): two worker nodes of 4 CPUs each, where Ray's default
    # strategy would pack two 0.5-CPU actors onto one node
    c = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    nodes = [c.add_node(num_cpus=4) for _ in range(2)]
    c.wait_for_nodes()
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield c, nodes
    ray.shutdown()
    c.shutdown()


def test_actors_spread_over_nodes_and_lose_nothing_with_a_node(cluster):
    c, nodes = cluster
    workers = RayWorkers(SleepyEpisodes(4.0), actors=2, per_actor=3, cpus_per_actor=0.5)
    try:
        actor_nodes = [ray.get(a.node.remote()) for a in workers.actors]
        assert len(set(actor_nodes)) == 2, "both actors landed on one node"
        assert set(actor_nodes) == {n.node_id for n in nodes}

        futures = [workers.submit(t, 0, 7) for t in range(6)]  # 3 in flight on each actor
        time.sleep(0.5)
        lost = next(n for n in nodes if n.node_id == actor_nodes[0])
        c.remove_node(lost)  # the node and every process on it: its 3 episodes die mid-sleep
        done, pending = wait(futures, timeout=120)
        assert not pending
        results = [f.result() for f in futures]
        replacement_node = ray.get(workers.actors[0].node.remote())
    finally:
        workers.close()
    assert sorted((t, j, v) for _, _, t, j, v in results) == [(t, 0, 7) for t in range(6)]
    assert workers.replaced == 1
    survivor = actor_nodes[1]
    assert all(node == survivor for node, *_ in results)  # the lost node's episodes ran again there
    assert replacement_node == survivor
