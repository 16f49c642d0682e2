"""Production requests -> a training batch: one reward per signalled request, advantages from the
chosen baseline (a request never baselines itself in the running mean, which shrinks a cluster's
few rewards toward the overall mean), unsignalled and not-token-exact requests left out."""

import pytest

from carl.online.batch import FOLLOWUP_HEADING, Baseline, build_batch
from carl.online.signals import SignalWeights

TRAJ = {"task_id": "t", "segments": [{"token_ids_T": [1, 2, 3], "generated_mask_T": [False, True, True],
                                      "logprobs_T": [0.0, -0.1, -0.2]}]}
EDIT = "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"


def req(i, kept, user="u", followup=None, traj=TRAJ):
    signals = [{"kind": "kept" if kept else "reverted", "value": 1.0}]
    if followup:
        signals.append({"kind": "followup", "value": None, "text": followup})
    return {"id": i, "session_id": f"s{i}", "request_index": 0, "text": "fix it", "edits": EDIT,
            "stop_reason": "finished", "trajectory": traj, "signals": signals}


def cluster(r):
    return r["session_id"][:2]  # s1.. s9: a few clusters


def test_batch_and_distill_baselines():
    w = SignalWeights()
    reqs = [req(1, True), req(2, False, followup="still broken"), req(3, False)]
    b = build_batch(reqs, cluster, w, Baseline(), "batch")
    rewards = [w.kept, w.reverted + w.followup, w.reverted]
    mean = sum(rewards) / 3
    assert [r.advantage for r in b.rollouts] == pytest.approx([x - mean for x in rewards])
    assert b.rollouts[1].feedback == "still broken" and b.rollouts[1].feedback_heading == FOLLOWUP_HEADING
    assert [r.passed for r in b.rollouts] == [True, False, False] and b.last_id == 3
    assert [r.advantage for r in build_batch(reqs, cluster, w, Baseline(), "distill").rollouts] == [0.0] * 3


def test_the_running_mean_never_baselines_a_request_with_itself_and_shrinks_small_clusters():
    w = SignalWeights()
    base = Baseline(prior_count=4.0)
    first = build_batch([req(1, True)], lambda r: "a", w, base, "running_mean")
    assert first.rollouts[0].advantage == 0.0  # no history: the batch mean (itself alone)
    second = build_batch([req(2, False)], lambda r: "b", w, base, "running_mean")
    assert second.rollouts[0].advantage == pytest.approx(w.reverted - w.kept)  # a new cluster: the overall mean
    third = build_batch([req(3, True)], lambda r: "a", w, base, "running_mean")
    overall = (w.kept + w.reverted) / 2
    expected = (1 * w.kept + 4.0 * overall) / (1 + 4.0)  # cluster a's one reward, shrunk
    assert third.rollouts[0].advantage == pytest.approx(w.kept - expected)
    assert Baseline.from_dict(base.to_dict()).means == base.means  # saved between cycles


def test_unsignalled_and_untrainable_requests_are_left_out():
    reqs = [req(1, True), {**req(2, True), "signals": []},
            req(3, True, traj={"task_id": "t", "segments": [{"token_ids_T": [], "generated_mask_T": []}]})]
    b = build_batch(reqs, cluster, SignalWeights(), Baseline(), "batch")
    assert [r.task.instance_id for r in b.rollouts] == ["s1/0"]
    assert b.stats["unsignalled"] == 1 and b.stats["requests"] == 3
    with pytest.raises(ValueError, match="online.baseline"):
        build_batch(reqs, cluster, SignalWeights(), Baseline(), "mean")


def test_the_prompt_baseline_is_the_mean_of_the_requests_asking_the_same_thing():
    w = SignalWeights()
    same = [{**req(1, True), "text": "fix  it\n"}, req(2, False), req(3, False)]  # whitespace aside, one text
    alone = {**req(4, True), "text": "something else"}
    b = build_batch([*same, alone], cluster, w, Baseline(), "prompt")
    group = (w.kept + 2 * w.reverted) / 3
    batch = (2 * w.kept + 2 * w.reverted) / 4
    assert [r.advantage for r in b.rollouts] == pytest.approx([w.kept - group, w.reverted - group,
                                                               w.reverted - group, w.kept - batch])
    assert b.stats["prompt_groups"] == 1
    # a question every user failed on teaches nothing through its rewards (the batch mean would push it down)
    failed = build_batch([req(1, False), req(2, False), {**req(3, True), "text": "other"},
                          {**req(4, True), "text": "other"}], cluster, w, Baseline(), "prompt")
    assert [r.advantage for r in failed.rollouts] == [0.0] * 4
