"""The scripted expert's self-summaries carry what the next context segment needs."""

import re

import pytest

from carl.harness.agent import EpisodeLimits
from carl.harness.tools import default_tools
from carl.micro.expert import SUMMARY, ExpertMistakes, ExpertPolicy, minimal_edit, patch_edits
from carl.micro.world import build_micro_tasks
from carl.rollout.rollout import collect_groups
from carl.sandbox.base import SandboxConfig
from carl.tasks import broken_repo_dir


@pytest.fixture(scope="module")
def level5_tasks(tmp_path_factory):
    out = tmp_path_factory.mktemp("micro5")
    return build_micro_tasks(out, seed=0, difficulty=5, repos={"eval": 1}, max_tasks_per_repo=3, backend="local")["eval"]


@pytest.fixture(scope="module")
def level4_tasks(tmp_path_factory):
    out = tmp_path_factory.mktemp("micro4")
    return build_micro_tasks(out, seed=0, difficulty=4, repos={"eval": 2}, max_tasks_per_repo=6, backend="local")["eval"]


def _constant_lines(task) -> list[str]:
    """The settings lines (`PRICE_STEP = 7`) of every upper-case name the gold code reads."""
    settings = next(p for p in broken_repo_dir(task).rglob("settings.py"))
    text = settings.read_text()
    names = {n for e in patch_edits(task.patch) for n in re.findall(r"\b[A-Z][A-Z_]+\b", e.new)}
    return [m.group(0) for n in sorted(names) for m in [re.search(rf"^{n} = .*$", text, re.M)] if m]


@pytest.mark.filterwarnings("ignore:carl. the .local. sandbox backend")
def test_summary_after_reading_holds_the_stub_and_the_definitions_read(level5_tasks):
    saw_constant = False
    for task in level5_tasks:
        expert = ExpertPolicy(task, ExpertMistakes())
        before = expert.reply(summary_requested=True)
        assert "not read" in before and "Read so far" not in before  # states only what the context showed
        read = expert.reply(summary_requested=False)
        assert "read_file" in read
        after = expert.reply(summary_requested=True)
        for e in patch_edits(task.patch):
            stub = minimal_edit(e, (broken_repo_dir(task) / e.path).read_text())
            assert stub.old.rstrip("\n") in after  # the exact text edit_file must replace
        name = re.search(r"def (\w+)\(", after).group(1)
        assert name in task.problem_statement  # the stub's def line names the task's function
        for line in _constant_lines(task):
            assert line in after, (line, after)
            saw_constant = True
        while "finish" not in expert.plan[expert.step]:  # edit and test: what is left is the finish
            expert.reply(summary_requested=False)
        late = expert.reply(summary_requested=True)
        assert late.endswith("Next: finish.") and "edit_file, run_tests" in late
        assert "NotImplementedError" not in late  # no longer the text to replace: it was edited
        assert ExpertPolicy(task, ExpertMistakes(), summary="fixed").reply(True) == SUMMARY
    assert saw_constant  # the world put at least one settings constant behind these tasks


@pytest.mark.filterwarnings("ignore:carl. the .local. sandbox backend")
def test_an_episode_reset_after_the_read_resumes_from_the_summary_and_passes(level5_tasks):
    task = next(t for t in level5_tasks if _constant_lines(t))
    tools = {n: t for n, t in default_tools().items() if n in ("read_file", "edit_file", "run_tests", "finish")}
    limits = EpisodeLimits(max_turns=8, summarize_at_fraction=0.001, max_summaries=1)  # reset after turn 1
    (group,) = collect_groups(lambda t, j: ExpertPolicy(task, ExpertMistakes()), [task], 1, limits, tools,
                              SandboxConfig(backend="local"))
    (r,) = group
    traj = r.trajectory
    assert r.passed, r.feedback
    assert [t.is_summary for t in traj.turns[:2]] == [False, True] and len(traj.segments) == 2
    resumed = traj.segments[1].messages[1].content  # the new segment's user message: task + summary
    for line in _constant_lines(task):
        assert line in resumed


def test_unknown_summary_kind_is_refused(level5_tasks):
    with pytest.raises(ValueError, match="summary"):
        ExpertPolicy(level5_tasks[0], summary="verbose")
    from carl.train.config import WarmStartConfig

    with pytest.raises(ValueError, match="warm_start.expert_summary"):
        WarmStartConfig(expert_summary="verbose")


@pytest.mark.filterwarnings("ignore:carl. the .local. sandbox backend")
def test_no_solved_expert_episode_names_the_limit_that_cut_its_replies(level5_tasks):
    """A user's limits.max_new_tokens below the expert's edit length is a UserError naming it (it
    read "the tasks or the harness are broken"); failures without a cut reply still say that."""
    from tiny_hf import tiny_tokenizer

    from carl.errors import UserError
    from carl.train.loop import expert_failure
    from carl.train.warm_start import expert_rollouts
    from carl.rollout.rollout import Rollout
    from carl.types import Trajectory

    tools = {n: t for n, t in default_tools().items() if n in ("read_file", "edit_file", "run_tests", "finish")}
    cut = EpisodeLimits(max_turns=4, max_new_tokens=12, max_tokens=40000, context_budget_tokens=20000)
    data = expert_rollouts(level5_tasks[:1], tiny_tokenizer(), 1, ExpertMistakes(), cut, tools,
                           SandboxConfig(backend="local"), seed=0)
    assert not any(r.passed for r in data)
    err = expert_failure(data, cut)
    assert isinstance(err, UserError) and "limits.max_new_tokens=12" in str(err), err
    unsolved = [Rollout(level5_tasks[0], Trajectory(task_id="t"), reward=0.0, feedback="1 of 2 tests did not pass")]
    err = expert_failure(unsolved, cut)
    assert not isinstance(err, UserError) and "tasks or the harness are broken" in str(err)
    assert "1 of 2 tests" in str(err)


@pytest.mark.filterwarnings("ignore:carl. the .local. sandbox backend")
def test_the_expert_says_the_same_words_before_every_test_run(level4_tasks):
    """Only the test output may tell a recovery from a finish: a planted wrong edit's test run is
    announced like every other, so the words before a run cannot predict that it passes."""
    import random

    from carl.micro.expert import plan_messages

    RUN = '<tool name="run_tests">'
    plans = [plan_messages(t, ExpertMistakes(wrong_edit=1.0), random.Random(0)) for t in level4_tasks]
    recoveries = [p for p in plans if sum(RUN in m for m in p) == 2]
    assert recoveries, "no level-4 task had a constant to get wrong"
    for plan in recoveries:
        runs = [i for i, m in enumerate(plan) if RUN in m]
        assert len({plan[i].split("<")[0] for i in runs}) == 1
        assert '<tool name="edit_file">' in plan[runs[0] + 1] and '<tool name="finish">' in plan[runs[1] + 1]


@pytest.mark.filterwarnings("ignore:carl. the .local. sandbox backend")
def test_a_sibling_body_first_fails_its_test_run_and_the_fix_passes(level4_tasks):
    """The planted sibling-body mistake is a real mistake (the run after it fails) and its recovery
    a real fix (the episode passes), on level-4 tasks that have a sibling."""
    from carl.micro.expert import SIBLING_FIX

    tasks = level4_tasks
    tools = {n: t for n, t in default_tools().items() if n in ("read_file", "edit_file", "run_tests", "finish")}
    groups = collect_groups(lambda t, j: ExpertPolicy(tasks[t], ExpertMistakes(sibling_body=1.0)), tasks, 1,
                            EpisodeLimits(max_turns=12), tools, SandboxConfig(backend="local"))
    planted = 0
    for (r,) in groups:
        assert r.passed, r.feedback
        messages = [m for seg in r.trajectory.segments for m in seg.messages]
        if any(m.role == "assistant" and m.content.startswith(SIBLING_FIX) for m in messages):
            planted += 1
            runs = [m.content for m in messages if m.role != "assistant" and "Tests:" in m.content]
            assert "failed" in runs[0] and "failed" not in runs[-1], runs
    assert planted >= len(tasks) // 2, f"a sibling body was planted in {planted} of {len(tasks)} tasks"
