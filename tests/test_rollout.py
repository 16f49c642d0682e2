"""Rollouts: a crashed episode becomes a masked error record that keeps its policy version; the
optional tool-error penalty; which groups carry a signal."""

import dataclasses

import pytest

from carl.harness.agent import EpisodeLimits
from carl.sandbox.base import SandboxConfig
from carl.tasks import TaskRecord
from carl.rewards.shaping import ShapingConfig
from carl.rollout.rollout import collect_groups, infra_error, require_valid, rollout_metrics
from carl.types import StopReason


class VersionedPolicy:
    policy_version = 7

    def chat(self, messages, max_new_tokens):
        raise AssertionError("never reached: the sandbox cannot open")


def test_each_episode_gets_the_policy_of_its_task_and_sample(tmp_path):
    tasks = [TaskRecord(instance_id=f"t{k}", repo="r", broken_repo=str(tmp_path / "missing")) for k in range(3)]
    asked: list[tuple[int, int]] = []

    class Versioned(VersionedPolicy):
        def __init__(self, t, j):
            asked.append((t, j))
            self.policy_version = 10 * t + j  # each rollout records the version of the policy that ran it

    groups = collect_groups(Versioned, tasks, 2, EpisodeLimits(max_turns=2), {}, SandboxConfig(backend="local"),
                            max_workers=4)
    assert sorted(asked) == [(t, j) for t in range(3) for j in range(2)]
    assert [[(r.task.instance_id, r.trajectory.policy_version) for r in g] for g in groups] == [
        [("t0", 0), ("t0", 1)], [("t1", 10), ("t1", 11)], [("t2", 20), ("t2", 21)]]


def test_crashed_episode_is_invalid_not_zero(tmp_path):
    task = TaskRecord(instance_id="t1", repo="r", broken_repo=str(tmp_path / "missing"))
    groups = collect_groups(lambda t, j: VersionedPolicy(), [task], 2, EpisodeLimits(max_turns=2), {},
                            SandboxConfig(backend="local"))
    assert len(groups) == 1 and len(groups[0]) == 2
    for r in groups[0]:
        assert not r.valid
        assert r.trajectory.stop_reason is StopReason.SANDBOX_ERROR
        assert r.trajectory.policy_version == 7
        assert "Traceback" in r.feedback
    m = rollout_metrics(groups)
    assert m["rl/infra_failures"] == 2.0 and m["rl/reward_mean"] == 0.0
    # one line says why (the exception, not the traceback), and a step of nothing but those stops
    why = infra_error(groups[0][0])
    assert "missing" in why and "Traceback" not in why and "\n" not in why
    with pytest.raises(RuntimeError, match=r"RL step 3: all 2 episodes failed in the infrastructure") as e:
        require_valid(groups[0], "RL step 3")
    assert f"2x {why}" in str(e.value)


def test_require_valid_passes_when_any_rollout_is_valid(tmp_path):
    task = TaskRecord(instance_id="t1", repo="r", broken_repo=str(tmp_path / "missing"))
    [[bad]] = collect_groups(lambda t, j: VersionedPolicy(), [task], 1, EpisodeLimits(max_turns=2), {},
                             SandboxConfig(backend="local"))
    good = dataclasses.replace(bad, valid=True)
    require_valid([bad, good], "RL step 1")  # no error
    require_valid([], "RL step 1")  # nothing ran: not this check's business
    assert infra_error(good) == ""


def test_tool_error_penalty_is_per_failed_call_and_capped_below_a_pass():
    from carl.rewards import tool_error_penalty

    assert tool_error_penalty(0, 0.1) == 0.0 and tool_error_penalty(5, 0.0) == 0.0
    assert tool_error_penalty(3, 0.1) == pytest.approx(0.3)
    assert tool_error_penalty(40, 0.1) == 0.5  # capped: a pass (1 - 0.5) still outranks a fail (0)
    with pytest.raises(ValueError, match="cost_per_error"):
        tool_error_penalty(1, -0.1)


def _micro_task(tmp_path, seed: int):
    """One real held-out micro task, the expert's tools, and a local sandbox config."""
    from carl.harness.tools import default_tools
    from carl.micro.world import build_micro_tasks

    world = build_micro_tasks(tmp_path, seed=seed, difficulty=1, repos={"eval": 1}, max_tasks_per_repo=1, backend="local")
    (task,) = world["eval"]
    tools = {n: t for n, t in default_tools().items() if n in ("read_file", "edit_file", "run_tests", "finish")}
    return task, tools, SandboxConfig(backend="local")


@pytest.mark.filterwarnings("ignore:carl. the .local. sandbox backend")
def test_a_failed_tool_call_costs_reward_but_not_the_pass(tmp_path):
    """A real micro task, solved by the scripted expert with and without a call to a missing tool."""
    from carl.micro.expert import ExpertMistakes, ExpertPolicy

    task, tools, sandbox = _micro_task(tmp_path, seed=0)
    limits = EpisodeLimits(max_turns=8)

    def rewards(mistakes, cost):
        (group,) = collect_groups(lambda t, j: ExpertPolicy(task, mistakes), [task], 1, limits, tools, sandbox,
                                  shaping=ShapingConfig(tool_error_cost=cost))
        (r,) = group
        assert r.valid and r.passed, r.feedback
        assert rollout_metrics([group])["rl/finish_rate"] == 1.0  # the expert ends with a finish call
        return r.reward, r.trajectory.num_tool_errors

    assert rewards(ExpertMistakes(), 0.1) == (1.0, 0)
    reward, errors = rewards(ExpertMistakes(bad_call=1.0), 0.1)
    assert errors == 1 and reward == pytest.approx(0.9)
    assert rewards(ExpertMistakes(bad_call=1.0), 0.0) == (1.0, 1)  # the default charges nothing

    (cut,) = collect_groups(lambda t, j: ExpertPolicy(task, ExpertMistakes()), [task], 1, EpisodeLimits(max_turns=1),
                            tools, sandbox)
    assert cut[0].trajectory.stop_reason is StopReason.MAX_TURNS
    assert rollout_metrics([cut])["rl/finish_rate"] == 0.0


@pytest.mark.filterwarnings("ignore:carl. the .local. sandbox backend")
def test_require_finish_fails_a_passing_episode_that_never_called_finish(tmp_path):
    """The expert's fix passes the tests either way; cut off before its finish call, it counts as a
    fail only with require_finish."""
    from carl.micro.expert import ExpertMistakes, ExpertPolicy

    task, tools, sandbox = _micro_task(tmp_path, seed=1)

    def run(max_turns, require_finish, mask_unfinished=False):
        (group,) = collect_groups(lambda t, j: ExpertPolicy(task, ExpertMistakes()), [task], 1,
                                  EpisodeLimits(max_turns=max_turns), tools, sandbox,
                                  shaping=ShapingConfig(require_finish=require_finish, mask_unfinished=mask_unfinished))
        (r,) = group
        if mask_unfinished:
            return r.trajectory.stop_reason, r.passed, r.reward, r.trained
        assert r.trained
        return r.trajectory.stop_reason, r.passed, r.reward

    full = run(8, False)
    assert full == (StopReason.FINISHED, True, 1.0)
    turns = 8
    while run(turns - 1, False)[0] is StopReason.FINISHED:  # the fewest turns that still end in a finish
        turns -= 1
    assert run(turns - 1, False) == (StopReason.MAX_TURNS, True, 1.0)  # tests pass, no finish: scored as a pass
    assert run(turns - 1, True) == (StopReason.MAX_TURNS, False, 0.0)  # ... unless finish is required
    assert run(turns, True) == (StopReason.FINISHED, True, 1.0)
    # mask_unfinished scores it as it is but leaves it out of training; a finished one trains
    assert run(turns - 1, False, True) == (StopReason.MAX_TURNS, True, 1.0, False)
    assert run(turns, False, True) == (StopReason.FINISHED, True, 1.0, True)


def test_shaping_takes_one_treatment_of_unfinished_episodes():
    with pytest.raises(ValueError, match="require_finish and shaping.mask_unfinished"):
        ShapingConfig(require_finish=True, mask_unfinished=True)


def test_has_signal_needs_a_pass_and_a_fail_not_just_a_penalty():
    from train_fakes import token_rollout

    from carl.rollout.rollout import has_signal

    seq = ([1, 2, 3], [False, True, True])
    penalized = [token_rollout(*seq, reward=0.0), token_rollout(*seq, reward=-0.2)]  # both failed
    assert not has_signal(penalized)
    passed_with_an_error = dataclasses.replace(token_rollout(*seq, reward=0.9), passed=True)
    assert has_signal([passed_with_an_error, token_rollout(*seq, reward=-0.2)])


@pytest.mark.parametrize("difficulty", [4, 5])
def test_the_expert_solves_reading_tasks_and_reads_the_settings_module_they_need(tmp_path, difficulty):
    """Levels 4-5 of the micro world: the expert (the warm start's teacher) restores every task, and at
    level 5 it reads the package's settings module, where the constants it writes live."""
    from carl.harness.tools import default_tools
    from carl.micro.expert import ExpertMistakes, ExpertPolicy
    from carl.micro.world import build_micro_tasks

    world = build_micro_tasks(tmp_path, seed=5, difficulty=difficulty, repos={"eval": 2}, max_tasks_per_repo=3,
                              backend="local")
    tasks = world["eval"]
    assert len(tasks) >= 4
    groups = collect_groups(lambda t, j: ExpertPolicy(tasks[t], ExpertMistakes()), tasks, 1,
                            EpisodeLimits(max_turns=8), default_tools(), SandboxConfig(backend="local"))
    for (r,) in groups:
        assert r.valid and r.passed, (r.task.instance_id, r.feedback)
        reads = [c.params["path"] for turn in r.trajectory.turns for c in turn.calls if c.name == "read_file"]
        reads_settings = any(p.endswith("/settings.py") for p in reads)
        assert reads_settings == ("settings." in r.task.patch), (r.task.instance_id, reads)


def _failed_calls(*kinds: str):
    """Turns of one failed call each, of these ToolError kinds (what shaping counts and gives back)."""
    from carl.types import ToolError, ToolResult, Turn

    return [Turn(assistant="", results=[ToolResult("edit_file", "", ok=False, error=ToolError(kind, f"a {kind} error"))])
            for kind in kinds]


def test_cost_needs_pass_gives_the_cost_back_only_in_a_group_where_nothing_passed():
    """With shaping.cost_needs_pass, a group of failures that differ only in failed calls carries no
    advantage (calling fewer tools is not rewarded where nothing passed); a group with a pass keeps
    the cost, and an invalid or untrained pass does not count as one."""
    import torch
    from train_fakes import token_rollout

    from carl.rl.advantages import group_advantages
    from carl.rollout.rollout import shape_group

    seq = ([1, 2, 3], [False, True, True])

    def ro(reward, failed_calls, passed=False, **kw):
        r = dataclasses.replace(token_rollout(*seq, reward=reward), passed=passed, **kw)
        r.trajectory.turns = _failed_calls(*["unknown_tool"] * failed_calls)
        return r

    def advantages(group):
        rewards_G = torch.tensor([r.reward for r in group])
        return group_advantages(rewards_G, torch.tensor([r.valid and r.trained for r in group])).tolist()

    all_fail = [ro(0.0, 0), ro(-0.2, 2), ro(-0.5, 7)]  # the penalty is capped at 0.5
    on = ShapingConfig(tool_error_cost=0.1, cost_needs_pass=True)
    assert advantages(all_fail) != [0.0, 0.0, 0.0]  # the cost alone makes a signal ...
    shaped = shape_group(all_fail, on)
    assert [r.reward for r in shaped] == [0.0, 0.0, 0.0] and advantages(shaped) == [0.0, 0.0, 0.0]  # ... not with it
    assert [r.reward for r in shape_group(all_fail, ShapingConfig(tool_error_cost=0.1))] == [0.0, -0.2, -0.5]

    mixed = [ro(0.9, 1, passed=True), ro(-0.2, 2), ro(0.0, 0)]
    assert [r.reward for r in shape_group(mixed, on)] == [0.9, -0.2, 0.0]  # a pass: the cost stays
    masked_pass = [ro(0.9, 1, passed=True, trained=False), ro(-0.2, 2)]
    assert [r.reward for r in shape_group(masked_pass, on)] == [1.0, 0.0]
    invalid_pass = [ro(0.0, 1, passed=True, valid=False), ro(-0.2, 2)]  # an invalid rollout scores 0, no penalty
    assert [r.reward for r in shape_group(invalid_pass, on)] == [0.0, 0.0]


def test_needs_pass_gives_back_execution_keeps_the_cost_of_malformed_calls():
    """With needs_pass_gives_back="execution", an all-fail group gets back the cost of calls that ran
    and failed, not of malformed ones (the cap applies to the whole penalty and to the part kept)."""
    from train_fakes import token_rollout

    from carl.rollout.rollout import shape_group

    def ro(malformed, failed_runs, passed=False):
        penalty = min(0.1 * (malformed + failed_runs), 0.5)
        r = dataclasses.replace(token_rollout([1, 2, 3], [False, True, True], reward=(0.9 if passed else 0.0) - penalty),
                                passed=passed)
        r.trajectory.turns = _failed_calls(*["extra_param"] * malformed, *["execution"] * failed_runs)
        return r

    on = ShapingConfig(tool_error_cost=0.1, cost_needs_pass=True, needs_pass_gives_back="execution")
    all_fail = [ro(0, 0), ro(0, 2), ro(2, 0), ro(1, 1), ro(7, 3), ro(2, 6)]
    assert [r.reward for r in shape_group(all_fail, on)] == pytest.approx([0.0, 0.0, -0.2, -0.1, -0.5, -0.2])
    everything = ShapingConfig(tool_error_cost=0.1, cost_needs_pass=True)
    assert [r.reward for r in shape_group(all_fail, everything)] == pytest.approx([0.0] * 6)
    mixed = [ro(1, 1, passed=True), ro(0, 2), ro(2, 0)]
    assert [r.reward for r in shape_group(mixed, on)] == pytest.approx([0.7, -0.2, -0.2])  # a pass: all costs stay


def test_needs_pass_gives_back_names_its_values_and_needs_cost_needs_pass():
    with pytest.raises(ValueError, match="shaping.needs_pass_gives_back: got 'format'.*'all' or 'execution'"):
        ShapingConfig(cost_needs_pass=True, needs_pass_gives_back="format")
    with pytest.raises(ValueError, match="shaping.cost_needs_pass=false.*set shaping.cost_needs_pass=true"):
        ShapingConfig(tool_error_cost=0.1, needs_pass_gives_back="execution")


def test_group_rewards_wants_one_penalty_and_outcome_per_reward():
    from carl.rewards.shaping import group_rewards

    with pytest.raises(ValueError, match="2 rewards, 1 penalties and 2 outcomes"):
        group_rewards([0.0, -0.1], [0.1], [False, False], ShapingConfig(cost_needs_pass=True))
