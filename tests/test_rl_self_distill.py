import pytest
import torch
from tiny_hf import tiny_tokenizer

from carl.harness.chat_tokens import TokenContext
from carl.harness.policies import ScriptedTokenPolicy
from carl.rl.self_distill import (
    SelfDistillConfig,
    build_teacher_context,
    combine_losses,
    find_error_turns,
    generated_runs,
    sampled_token_sd_loss,
    srpo_split,
    topk_kl_loss,
)
from carl.types import Message, ToolCall, ToolError, ToolResult, Trajectory, Turn

FAIL = (
    "Tests: 1 passed, 2 failed (exit code 1: some tests failed, 0.3 s)\nFailed:\n  tests/test_a.py::test_add"
)
PASS = "Tests: 3 passed (exit code 0: all selected tests passed, 0.3 s)"
TOOLS = ("read_file", "edit_file", "run_tests", "finish")
REPLIES = [
    '<tool name="reed_file"><path>a.py</path></tool>',
    '<tool name="edit_file"><path>a.py</path><old>x = 1</old><new>x = 2</new></tool>',
    '<tool name="run_tests"></tool>',
    '<tool name="edit_file"><path>a.py</path><old>x = 2</old><new>x = 3</new></tool>',
    '<tool name="run_tests"></tool>',
    '<tool name="finish"></tool>',
]


def _recorded_trajectory():
    """Six turns recorded token-exactly through the harness's TokenContext with a scripted policy."""
    tok = tiny_tokenizer()
    ctx = TokenContext(ScriptedTokenPolicy(tok, REPLIES))
    ctx.start([Message("system", "You are a coding agent."), Message("user", "Fix the failing tests.")])
    bad = ToolError("unknown_tool", "unknown tool 'reed_file'", tool="reed_file", valid_tools=TOOLS)
    results = [
        [ToolResult("reed_file", "unknown tool 'reed_file'", ok=False, error=bad)],
        [ToolResult("edit_file", "edited a.py", ok=True)],
        [ToolResult("run_tests", FAIL, ok=True)],
        [ToolResult("edit_file", "edited a.py", ok=True)],
        [ToolResult("run_tests", PASS, ok=True)],
        [ToolResult("finish", "done", ok=True)],
    ]
    turns = []
    for reply, res in zip(REPLIES, results):
        text = ctx.generate(64, 100_000)
        assert text == reply
        name = reply.split('"')[1]
        turns.append(
            Turn(
                assistant=text,
                calls=[ToolCall(name, {})],
                errors=[bad] if name == "reed_file" else [],
                results=res,
            )
        )
        ctx.add(Message("tool", res[0].output))
    return tok, Trajectory(task_id="t", turns=turns, segments=[ctx.segment])


def test_find_error_turns_tool_error_and_failing_tests():
    _, traj = _recorded_trajectory()
    found = find_error_turns(traj)
    assert [(e.turn, e.kind) for e in found] == [(0, "tool_error"), (1, "failing_tests")]
    assert (
        "unknown tool 'reed_file'" in found[0].hint and "Valid tools: read_file, edit_file" in found[0].hint
    )
    assert "tests/test_a.py::test_add" in found[1].hint


def test_failed_reward_blames_unblamed_edit_turns_and_adds_sibling_actions():
    _, traj = _recorded_trajectory()
    sibling = Trajectory(
        task_id="t", turns=[Turn(assistant="", calls=[ToolCall("edit_file", {"path": "b.py"})])]
    )
    found = find_error_turns(traj, reward_feedback="FAILED tests/test_b.py::test_mul", sibling=sibling)
    assert [(e.turn, e.kind) for e in found] == [
        (0, "tool_error"),
        (1, "failing_tests"),
        (3, "failed_reward"),
    ]
    assert "test_mul" in found[2].hint
    assert "unknown tool 'reed_file'" in found[0].hint and "tests/test_a.py::test_add" in found[1].hint
    demo = '<tool name="edit_file"><path>b.py</path></tool>'
    assert all(demo in e.hint for e in found), "a failed episode's every hint shows the sibling's actions"
    assert demo not in " ".join(e.hint for e in find_error_turns(traj, sibling=sibling)), "passed: no sibling"


def test_teacher_context_inserts_hint_before_the_turn_and_copies_student_tokens():
    tok, traj = _recorded_trajectory()
    seg = traj.segments[0]
    runs = generated_runs(seg.generated_mask_T)
    assert len(runs) == 6
    tc = build_teacher_context(traj, 2, "HINT: check the add function", tok)
    start, end = runs[2]
    assert tc.student_positions == list(range(start, end))
    assert [tc.teacher_ids[p] for p in tc.teacher_positions] == seg.token_ids_T[start:end]
    assert tc.teacher_positions[-1] == len(tc.teacher_ids) - 1
    before = tok.decode(seg.token_ids_T[:start])
    header = "<|im_start|>assistant\n"
    assert before.endswith(header)
    expected = (
        before[: -len(header)]
        + "<|im_start|>user\nHINT: check the add function<|im_end|>\n"
        + header
        + REPLIES[2]
    )
    assert tok.decode(tc.teacher_ids) == expected + "<|im_end|>"  # the sampled stop token is scored too


def test_teacher_context_rejects_turn_without_tokens():
    tok, traj = _recorded_trajectory()
    traj.segments[0].generated_mask_T = [False] * len(traj.segments[0].token_ids_T)
    with pytest.raises(ValueError, match="generated runs"):
        build_teacher_context(traj, 0, "hint", tok)


def _full_kl(s, t):
    logp, logq = torch.log_softmax(s, -1), torch.log_softmax(t, -1)
    return (logp.exp() * (logp - logq)).sum(-1)


def test_topk_kl_with_k_equal_vocab_is_the_full_kl_and_has_finite_grads():
    torch.manual_seed(0)
    s = torch.randn(5, 11, requires_grad=True)
    t = torch.randn(5, 11)
    mask = torch.tensor([True, True, False, True, True])
    loss, metrics = topk_kl_loss(s, t, mask, k=11)
    ref = _full_kl(s, t)[mask].mean()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    loss.backward()
    assert torch.isfinite(s.grad).all()
    assert metrics["student_tail_mass"] == 0.0


def test_topk_kl_small_k_is_a_lower_bound_and_close_for_peaked_students():
    torch.manual_seed(1)
    t = torch.randn(64, 32)
    flat = torch.randn(64, 32)
    peaked = torch.randn(64, 32) * 6
    for s in (flat, peaked):
        full = _full_kl(s, t)
        for k in (1, 4, 16):
            approx, _ = topk_kl_loss(s, t, torch.ones(64, dtype=torch.bool), k)
            per_tok = torch.stack(
                [topk_kl_loss(s[i : i + 1], t[i : i + 1], torch.ones(1), k)[0] for i in range(64)]
            )
            # bucketing is a coarse-graining: KL can only shrink (data processing inequality)
            assert (per_tok <= full + 1e-5).all() and (per_tok >= -1e-6).all()
            assert approx.item() == pytest.approx(per_tok.mean().item(), rel=1e-5)
    close, _ = topk_kl_loss(peaked, t, torch.ones(64, dtype=torch.bool), 16)
    assert close.item() == pytest.approx(_full_kl(peaked, t).mean().item(), rel=0.05)


def test_topk_kl_gradient_reaches_student_only_and_only_masked_rows():
    s = torch.randn(3, 7, requires_grad=True)
    t = torch.randn(3, 7, requires_grad=True)
    loss, _ = topk_kl_loss(s, t, torch.tensor([True, False, True]), k=3)
    loss.backward()
    assert t.grad is None
    assert s.grad[1].abs().max() == 0 and s.grad[0].abs().max() > 0


def test_sampled_token_estimator_by_hand():
    student = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    teacher = torch.tensor([-0.5, -3.0, -9.0])
    loss, metrics = sampled_token_sd_loss(student, teacher, torch.tensor([True, True, False]))
    # advantages 0.5 and -1.0 on the two masked tokens: loss = -(0.5 * -1 + -1 * -2) / 2
    assert loss.item() == pytest.approx(-(-0.5 + 2.0) / 2)
    loss.backward()
    assert student.grad.tolist() == pytest.approx([-0.25, 0.5, 0.0])
    assert metrics["advantage_mean"] == pytest.approx(-0.25)


def test_srpo_split_and_combination():
    to_grpo, to_sd = srpo_split(
        torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([True, True, False, True]), 1.0
    )
    assert to_grpo.tolist() == [True, False, False, False]
    assert to_sd.tolist() == [False, True, False, True]
    loss, metrics = combine_losses(
        (torch.tensor(1.0), {"clip_frac": 0.1}), (torch.tensor(2.0), {"kl": 2.0}), 0.5
    )
    assert loss.item() == 2.0 and metrics["grpo/clip_frac"] == 0.1 and metrics["sd/kl"] == 2.0


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="topk"):
        SelfDistillConfig(topk=0)
    with pytest.raises(ValueError, match="ema_decay"):
        SelfDistillConfig(ema_decay=1.0)


def test_teacher_logits_left_padded_match_one_context_at_a_time(tmp_path):
    from tiny_hf import save_tiny_model

    from carl.engine.hf import load_model
    from carl.rl.self_distill import TeacherContext, teacher_logits

    _, model = load_model(save_tiny_model(tmp_path / "m"), torch.float32)
    contexts = [
        TeacherContext([1, 5, 9, 12, 40, 41], [4, 5], 0, [10, 11]),
        TeacherContext([1, 7, 3], [1, 2], 0, [3, 4]),
        TeacherContext([1, 7, 3, 8, 8, 8, 9, 10], [5, 6, 7], 0, [5, 6, 7]),
    ]
    got_N_V = teacher_logits(model, contexts, pad_id=0)
    assert got_N_V.shape == (7, model.config.vocab_size)
    with torch.no_grad():
        ref = [
            model(input_ids=torch.tensor([c.teacher_ids])).logits[0, [p - 1 for p in c.teacher_positions]]
            for c in contexts
        ]
    assert torch.allclose(got_N_V, torch.cat(ref), atol=1e-4)


def test_ema_update_moves_teacher_towards_student():
    from carl.rl.self_distill import ema_update

    teacher, student = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    with torch.no_grad():
        for p in teacher.parameters():
            p.fill_(1.0)
        for p in student.parameters():
            p.fill_(3.0)
    ema_update(teacher, student, decay=0.75)
    assert all(torch.allclose(p, torch.full_like(p, 1.5)) for p in teacher.parameters())
