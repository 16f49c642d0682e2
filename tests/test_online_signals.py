"""Rewards from production signals: the documented weights, a user who changes their mind counts
once, no signal means no reward, and flagged work (no edit, a no-op edit, broken calls) never
scores above an honest failure, whatever the user signalled."""

import pytest

from carl.online.signals import SignalWeights, noop_edit, production_flags, request_reward

EDIT = "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n def f(x):\n-    raise NotImplementedError\n+    return 3 * x + 2\n"
NOOP = "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n def f(x):\n-    return x  # old\n+    return  x   # new comment\n"


def req(*signals, edits=EDIT, stop="finished", tool_errors=0):
    turns = [{"errors": [{"kind": "malformed"}] * tool_errors}]
    return {"edits": edits, "stop_reason": stop, "trajectory": {"turns": turns},
            "signals": [{"kind": k, "value": v, "text": None} for k, v in signals]}


def test_weights_add_up_as_documented():
    w = SignalWeights()
    assert request_reward(req(("tests", 1.0), ("kept", 1.0))) == w.kept + w.tests_pass
    assert request_reward(req(("tests", 0.0), ("reverted", 1.0), ("followup", 1.0))) == \
        w.reverted + w.tests_fail + w.followup
    assert request_reward(req(("thumbs", -1.0))) == -w.thumbs
    assert request_reward(req(("still_present", 0.0))) == -w.still_present
    assert request_reward(req(("comment", None))) is None  # text only: no reward
    assert request_reward(req()) is None


def test_a_user_who_changes_their_mind_counts_once_as_they_ended_up():
    w = SignalWeights()
    assert request_reward(req(("kept", 1.0), ("reverted", 1.0))) == w.reverted
    assert request_reward(req(("thumbs", 1.0), ("thumbs", -1.0))) == -w.thumbs


@pytest.mark.parametrize("flagged, flag", [
    (req(("kept", 1.0), ("thumbs", 1.0), edits=""), "no_edit"),
    (req(("kept", 1.0), ("tests", 1.0), edits=NOOP), "noop_edit"),
    (req(("kept", 1.0), tool_errors=3), "broken_calls"),
])
def test_broken_or_skipped_work_never_beats_an_honest_failure(flagged, flag):
    w = SignalWeights()
    honest = request_reward(req(("tests", 0.0), ("reverted", 1.0)))
    assert honest == w.honest_failure
    assert production_flags(flagged) == [flag]
    assert request_reward(flagged) < honest


def test_infrastructure_failures_are_masked_not_scored():
    assert production_flags(req(("reverted", 1.0), stop="sandbox_error")) == ["infra"]
    assert request_reward(req(("reverted", 1.0), stop="policy_error")) is None


def test_noop_edits_are_whitespace_and_comment_changes_only():
    assert noop_edit(NOOP) and not noop_edit(EDIT)
    assert not noop_edit("--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n")


def test_bad_weights_name_the_field():
    with pytest.raises(ValueError, match="signals.hack_margin"):
        SignalWeights(hack_margin=-1)
    with pytest.raises(ValueError, match="signals.kept"):
        SignalWeights(kept=-2.0)
