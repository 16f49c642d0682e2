"""rl_step on hand-built groups with a tiny random Llama: what changes, what gets gradient, who is trained how.

Plain SGD (lr 1) makes the weight change equal the (clipped) gradient, so comparing weight deltas
compares gradients exactly."""

import dataclasses
import math

import pytest
import torch
from tiny_hf import save_tiny_model, tiny_tokenizer
from train_fakes import TOOLS, failed_rollout, solved_rollout, token_rollout, tokens_through

from carl.engine.hf import load_model
from carl.tasks import TaskRecord
from carl.train.config import RLConfig
from carl.train.loop import set_trainable
from carl.train.step import build_sequences, rl_step
from carl.train.warm_start import round_robin_by_repo

GRPO_ONLY = RLConfig(sd_weight=0.0, grad_clip=1e9)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


def _model(tiny_dir, trainable_layers=0):
    tokenizer, model = load_model(tiny_dir, torch.float32)
    params = set_trainable(model, trainable_layers)
    return tokenizer, model, torch.optim.SGD(params, lr=1.0)


def _deltas(tiny_dir, groups, cfg=GRPO_ONLY, trainable_layers=0, tokenizer=None):
    """(metrics, {name: weight change}) of one rl_step from the same initial weights."""
    tok, model, opt = _model(tiny_dir, trainable_layers)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = rl_step(model, opt, None, groups, cfg, tokenizer or tok, tok.pad_token_id, token_normalizer=64.0,
                      valid_tools=TOOLS)
    return metrics, {k: v - before[k] for k, v in model.state_dict().items()}


def _seq(seed, n_prompt=12, n_gen=6, n_obs=5):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 300, (n_prompt + n_gen + n_obs,), generator=g).tolist()
    mask = [False] * n_prompt + [True] * n_gen + [False] * n_obs
    return ids, mask


def _group(rewards, seed=0, **kw):
    return [token_rollout(*_seq(seed + i, **kw), reward=r) for i, r in enumerate(rewards)]


def test_loss_is_finite_and_only_trainable_params_change(tiny_dir):
    metrics, deltas = _deltas(tiny_dir, [_group([1.0, 0.0, 0.0]), _group([0.0, 1.0, 1.0], seed=10)],
                              trainable_layers=1)
    assert math.isfinite(metrics["loss/total"]) and metrics["rl/grad_norm"] > 0
    assert metrics["rl/num_sequences"] == 6 and metrics["grpo/num_tokens"] == 36
    changed = {k for k, d in deltas.items() if d.abs().max() > 0}
    assert changed, "no parameter moved"
    assert all(k.startswith(("model.layers.1.", "model.norm.")) for k in changed), sorted(changed)
    assert any(k.startswith("model.layers.1.") for k in changed)
    assert not any(k.startswith(("model.layers.0.", "model.embed_tokens", "lm_head")) for k in changed)


def test_observation_tokens_get_no_gradient(tiny_dir):
    """Perturbing observation tokens after the last sampled token, and the rollout log-probs at
    observation positions, leaves the update unchanged; perturbing a sampled token does not."""
    group = _group([1.0, 0.0])
    _, base = _deltas(tiny_dir, [group])

    perturbed = []
    for r in group:
        seg = r.trajectory.segments[0]
        ids = list(seg.token_ids_T)
        ids[-5:] = [(t + 17) % 300 + 3 for t in ids[-5:]]  # the trailing observation tokens
        logprobs = [lp if g else -7.5 for lp, g in zip(seg.logprobs_T, seg.generated_mask_T)]
        p = token_rollout(ids, seg.generated_mask_T, r.reward)
        p.trajectory.segments[0].logprobs_T = logprobs
        perturbed.append(p)
    _, same = _deltas(tiny_dir, [perturbed])
    for k in base:
        torch.testing.assert_close(same[k], base[k], rtol=0, atol=0)

    ids, mask = list(group[0].trajectory.segments[0].token_ids_T), group[0].trajectory.segments[0].generated_mask_T
    ids[14] = (ids[14] + 17) % 300 + 3  # a sampled token
    _, other = _deltas(tiny_dir, [[token_rollout(ids, mask, 1.0), group[1]]])
    assert any(not torch.equal(other[k], base[k]) for k in base)


def test_invalid_rollouts_are_excluded(tiny_dir):
    group = _group([1.0, 0.0, 0.0])
    broken = token_rollout(*_seq(99), reward=float("nan"), valid=False)  # infra failure: masked, never scored 0
    metrics_a, with_invalid = _deltas(tiny_dir, [group + [broken]])
    metrics_b, without = _deltas(tiny_dir, [group])
    assert metrics_a["rl/num_sequences"] == metrics_b["rl/num_sequences"] == 3
    assert math.isfinite(metrics_a["loss/total"])
    for k in without:
        torch.testing.assert_close(with_invalid[k], without[k])


def test_untrained_rollouts_leave_the_baseline_and_the_loss(tiny_dir):
    """An episode shaping leaves out (mask_unfinished, no finish call) moves nothing: not its own
    tokens, and not its siblings' advantages through the group's mean, although it passed."""
    group = _group([1.0, 0.0, 0.0])
    unfinished = dataclasses.replace(token_rollout(*_seq(99), reward=1.0), trained=False)
    metrics_a, with_untrained = _deltas(tiny_dir, [group + [unfinished]])
    metrics_b, without = _deltas(tiny_dir, [group])
    assert metrics_a["rl/num_sequences"] == metrics_b["rl/num_sequences"] == 3
    for k in without:
        torch.testing.assert_close(with_untrained[k], without[k])
    _, trained = _deltas(tiny_dir, [group + [dataclasses.replace(unfinished, trained=True)]])
    assert any(not torch.equal(trained[k], without[k]) for k in without)  # the same rollout, trained: it counts


def test_group_with_equal_rewards_does_not_move_the_policy(tiny_dir):
    metrics, deltas = _deltas(tiny_dir, [_group([1.0, 1.0, 1.0])])
    assert metrics["loss/total"] == 0.0
    assert all(d.abs().max() == 0 for d in deltas.values())


def test_srpo_routes_successes_to_grpo_and_failures_to_self_distillation():
    tok = tiny_tokenizer()
    group = [solved_rollout(tok), failed_rollout(tok)]
    routed = build_sequences([group], RLConfig(route_by_outcome=True, sd_weight=0.5), tok, TOOLS)
    assert [(s.use_grpo, len(s.teachers)) for s in routed] == [(True, 0), (False, 2)]
    seg = group[1].trajectory.segments[0]
    for t in routed[1].teachers:  # the teacher scores the student's own tokens, copied not re-tokenized
        assert [t.teacher_ids[p] for p in t.teacher_positions] == [seg.token_ids_T[p] for p in t.student_positions]
        assert all(seg.generated_mask_T[p] for p in t.student_positions)

    mixed = build_sequences([group], RLConfig(route_by_outcome=False, sd_weight=0.5), tok, TOOLS)
    assert [(s.use_grpo, len(s.teachers)) for s in mixed] == [(True, 0), (True, 2)]
    assert all("A successful attempt" in t_hint for t_hint in _teacher_texts(tok, mixed[1]))
    no_success = [failed_rollout(tok), failed_rollout(tok)]
    assert [len(s.teachers) for s in build_sequences([no_success], RLConfig(sd_weight=0.5), tok, TOOLS)] == [0, 0]
    feedback = build_sequences([no_success], RLConfig(sd_weight=0.5, sd_needs_success=False), tok, TOOLS)
    assert [len(s.teachers) for s in feedback] == [2, 2]
    assert not any("A successful attempt" in h for s in feedback for h in _teacher_texts(tok, s))
    off = build_sequences([group], RLConfig(route_by_outcome=False, sd_weight=0.0), tok, TOOLS)
    assert [len(s.teachers) for s in off] == [0, 0]


def _teacher_texts(tok, seq) -> list[str]:
    return [tok.decode(t.teacher_ids[: t.teacher_positions[0]]) for t in seq.teachers]


@pytest.mark.parametrize("sd_loss", ["topk", "sampled"])
def test_rl_step_with_srpo_trains_grpo_on_successes_and_distills_failures(tiny_dir, sd_loss):
    tok = tiny_tokenizer()
    solved, failed = solved_rollout(tok), failed_rollout(tok)
    cfg = RLConfig(route_by_outcome=True, sd_weight=0.5, sd_loss=sd_loss, sd_topk=8)
    metrics, deltas = _deltas(tiny_dir, [[solved, failed]], cfg=cfg, tokenizer=tok)
    assert metrics["grpo/num_tokens"] == solved.trajectory.num_generated_tokens  # failures: no GRPO tokens
    sd_tokens = sum(len(t.student_positions) for s in build_sequences([[solved, failed]], cfg, tok, TOOLS)
                    for t in s.teachers)
    assert metrics["sd/num_tokens"] == sd_tokens > 0 and metrics["sd/num_turns"] == 2
    assert math.isfinite(metrics["loss/total"]) and metrics["loss/self_distill"] != 0.0
    assert any(d.abs().max() > 0 for d in deltas.values())


def test_sft_epoch_learns_the_expert_tokens_and_skips_failed_rollouts(tiny_dir):
    import random

    from carl.train.warm_start import sft_epoch

    tok = tiny_tokenizer()
    _, model = load_model(tiny_dir, torch.float32)
    params = set_trainable(model, 0)
    optimizer = torch.optim.AdamW(params, lr=3e-3)
    data = [solved_rollout(tok), failed_rollout(tok)]  # the failed one must not be imitated
    epochs = [sft_epoch(model, optimizer, data, tok.pad_token_id, batch_size=1, micro_batch_tokens=4096,
                        grad_clip=1.0, rng=random.Random(e)) for e in range(4)]
    assert all(len(losses) == 1 for losses in epochs)  # one batch: the solved rollout's one segment
    assert epochs[-1][0] < 0.7 * epochs[0][0], epochs


def test_a_segment_without_generated_tokens_is_skipped(tiny_dir):
    """A resumed segment that a limit cut before its first reply has no loss terms: it must not
    reach the model (alone in a micro-batch it would score no position)."""
    group = _group([1.0, 0.0])
    prompt_only = _seq(7, n_gen=0)
    group[1].trajectory.segments.append(
        token_rollout(*prompt_only, reward=0.0).trajectory.segments[0])
    metrics, deltas = _deltas(tiny_dir, [group])
    assert metrics["rl/num_sequences"] == 2 and math.isfinite(metrics["loss/total"])
    _, without = _deltas(tiny_dir, [_group([1.0, 0.0])])
    for k in without:
        torch.testing.assert_close(deltas[k], without[k])
    only_empty = [token_rollout(*prompt_only, reward=1.0), token_rollout(*prompt_only, reward=0.0)]
    assert _deltas(tiny_dir, [only_empty])[0] == {"rl/num_sequences": 0.0, "rl/sequences_without_gradient": 0.0}


def test_sequences_without_gradient_are_skipped_and_the_update_stays_the_same(tiny_dir, monkeypatch):
    from carl.train import step

    groups = [_group([1.0, 0.0, 0.0]), _group([0.0, 0.0, 0.0], seed=10), _group([1.0, 1.0, 1.0], seed=20)]
    metrics, deltas = _deltas(tiny_dir, groups)
    assert (metrics["rl/num_sequences"], metrics["rl/sequences_without_gradient"]) == (3, 6)
    with monkeypatch.context() as m:
        m.setattr(step, "with_gradient", lambda seqs, cfg: seqs)  # train on all nine, as before the cut
        every, every_deltas = _deltas(tiny_dir, groups)
    assert every["rl/num_sequences"] == 9 and every["loss/total"] == pytest.approx(metrics["loss/total"])
    assert any(d.abs().max() > 0 for d in deltas.values())
    for k in deltas:
        torch.testing.assert_close(deltas[k], every_deltas[k], rtol=1e-5, atol=1e-7)
    # a KL penalty has a gradient everywhere: nothing is skipped
    seqs = build_sequences(groups, GRPO_ONLY, tiny_tokenizer(), TOOLS)
    assert step.with_gradient(seqs, dataclasses.replace(GRPO_ONLY, kl_coef=0.1)) == seqs
    # none with a gradient: the shortest stays, so that the optimizer steps as it did (here: nothing moves)
    all_equal = [_group([0.0, 0.0], seed=30, n_gen=9), _group([1.0, 1.0], seed=40, n_gen=3)]
    kept = step.with_gradient(build_sequences(all_equal, GRPO_ONLY, tiny_tokenizer(), TOOLS), GRPO_ONLY)
    assert [sum(s.generated_mask_T) for s in kept] == [3]


def test_expert_episodes_take_one_task_of_each_repo_in_turn():
    tasks = [TaskRecord(instance_id=f"{repo}__{i}", repo=repo, problem_statement="")
             for repo, n in (("a", 3), ("b", 1), ("c", 2)) for i in range(n)]
    assert [t.instance_id for t in round_robin_by_repo(tasks)] == ["a__0", "b__0", "c__0", "a__1", "c__1", "a__2"]


def test_a_group_has_signal_only_when_its_valid_rewards_differ():
    from carl.rollout.rollout import has_signal

    assert has_signal(_group([1.0, 0.0, 0.0]))
    assert not has_signal(_group([0.0, 0.0, 0.0])) and not has_signal(_group([1.0, 1.0]))
    masked = _group([1.0, 0.0])
    masked[1] = dataclasses.replace(masked[1], valid=False)  # an infrastructure failure is not a 0
    assert not has_signal(masked)
    unfinished = _group([1.0, 0.0])
    unfinished[0] = dataclasses.replace(unfinished[0], trained=False)  # shaping.mask_unfinished left it out
    assert not has_signal(unfinished)


def _summarized_rollout(reward):
    """Two segments: the first has a reply, a tool output and then a self-summary (its last reply)."""
    from carl.types import Turn

    seg0 = [False] * 6 + [True] * 4 + [False] * 3 + [True] * 5  # reply, observation + request, summary
    seg1 = [False] * 8 + [True] * 4 + [False] * 2  # resumed prompt, reply, observation
    r = token_rollout(list(range(3, 3 + len(seg0))), seg0, reward)
    r.trajectory.segments.append(token_rollout(list(range(40, 40 + len(seg1))), seg1, reward).trajectory.segments[0])
    r.trajectory.turns = [Turn("a", segment=0), Turn("summary", segment=0, is_summary=True), Turn("b", segment=1)]
    return r


def test_train_summaries_off_masks_only_the_summary_reply(tiny_dir):
    from carl.train.step import without_last_reply

    assert without_last_reply([False, True, True, False, True, True, False]) == [False, True, True] + [False] * 4
    assert without_last_reply([False, False]) == [False, False]
    group = [_summarized_rollout(1.0), _summarized_rollout(0.0)]
    tok = tiny_tokenizer()
    on = build_sequences([group], GRPO_ONLY, tok, TOOLS)
    off = build_sequences([group], dataclasses.replace(GRPO_ONLY, train_summaries=False), tok, TOOLS)
    assert [sum(s.generated_mask_T) for s in on] == [9, 4, 9, 4]
    assert [sum(s.generated_mask_T) for s in off] == [4, 4, 4, 4]  # the 5 summary tokens left out
    assert off[0].generated_mask_T[:10] == on[0].generated_mask_T[:10]  # the reply before it still trains
    m_on, _ = _deltas(tiny_dir, [group])
    m_off, _ = _deltas(tiny_dir, [group], cfg=dataclasses.replace(GRPO_ONLY, train_summaries=False))
    assert m_on["grpo/num_tokens"] - m_off["grpo/num_tokens"] == 10


def _prefixed_groups(prefix_len=40):
    """Two groups whose sequences all start with the same `prefix_len` tokens (a system prompt),
    then differ (task prompt, sampled reply, observation)."""
    prompt = _seq(1000, n_prompt=prefix_len, n_gen=0, n_obs=0)[0]
    groups = []
    for g, rewards in enumerate(([1.0, 0.0, 0.0], [0.0, 1.0])):
        rows = [_seq(50 * g + i, n_prompt=4 + i, n_gen=6, n_obs=5) for i in range(len(rewards))]
        groups.append([token_rollout(prompt + ids, [False] * prefix_len + mask, reward=r)
                       for (ids, mask), r in zip(rows, rewards)])
    return groups


def test_a_shared_prompt_runs_once_per_micro_batch_and_trains_the_same_weights(tiny_dir):
    groups = _prefixed_groups()
    shared_metrics, shared = _deltas(tiny_dir, groups)
    full_metrics, full = _deltas(tiny_dir, groups, cfg=dataclasses.replace(GRPO_ONLY, share_prefix=False))
    assert full_metrics["rl/prefix_tokens_shared"] == 0
    assert shared_metrics["rl/prefix_tokens_shared"] == 40 * 4  # one micro-batch of 5 rows
    assert shared_metrics["loss/total"] == pytest.approx(full_metrics["loss/total"], rel=1e-5)
    assert any(d.abs().max() > 0 for d in full.values())
    for name in full:
        torch.testing.assert_close(shared[name], full[name], rtol=1e-4, atol=1e-6)

    tok, model, opt = _model(tiny_dir)
    step_tokens = []
    for cfg in (GRPO_ONLY, GRPO_ONLY, dataclasses.replace(GRPO_ONLY, share_prefix=False)):
        seen = tokens_through(model)
        rl_step(model, opt, None, groups, cfg, tok, tok.pad_token_id, token_normalizer=64.0, valid_tools=TOOLS)
        step_tokens.append(seen[0])
        model.model.layers[0]._forward_pre_hooks.clear()
    longest = max(len(r.trajectory.segments[0].token_ids_T) for g in groups for r in g)
    assert step_tokens[2] == 5 * longest  # every row padded to the longest, the prompt 5 times
    assert step_tokens[1] == 40 + 5 * (longest - 40)  # after the first step's check: the prompt once
    assert step_tokens[0] > step_tokens[1]  # the first shared pass of a model is checked against the full one


def test_a_model_that_misreads_the_shared_prompt_keeps_full_passes(tiny_dir, monkeypatch, caplog):
    """A model whose pass depends on where a call starts (here: the first position of each call is
    shifted, as a model that ignores the cached positions would be) fails the one-time check:
    sharing stays off and the update is exactly the full passes' one."""

    def misread(model):
        model.model.layers[0].register_forward_pre_hook(
            lambda m, a, kw: ((a[0] + torch.nn.functional.pad(torch.ones_like(a[0][:, :1]), (0, 0, 0, a[0].shape[1] - 1)),)
                              + a[1:], kw) if a else None, with_kwargs=True)

    groups = _prefixed_groups()
    out = {}
    for share in (True, False):
        tok, model, opt = _model(tiny_dir)
        misread(model)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        with caplog.at_level("WARNING", logger="carl.train.prefix"):
            metrics = rl_step(model, opt, None, groups, dataclasses.replace(GRPO_ONLY, share_prefix=share), tok,
                              tok.pad_token_id, token_normalizer=64.0, valid_tools=TOOLS)
        out[share] = metrics, {k: v - before[k] for k, v in model.state_dict().items()}
    assert out[True][0]["rl/prefix_tokens_shared"] == 0
    assert "every pass stays full" in caplog.text
    for name in out[False][1]:
        torch.testing.assert_close(out[True][1][name], out[False][1][name], rtol=0, atol=0)


def test_the_common_prefix_ends_before_the_first_scored_token():
    from carl.train.prefix import MIN_PREFIX, common_prefix_len, shared_cost

    base = list(range(3, 103))
    rows = [base, base[:60] + [7] * 40]
    scored = [[t >= 80 for t in range(100)], [t >= 70 for t in range(100)]]
    assert common_prefix_len(rows, scored) == 60  # where the rows part
    assert common_prefix_len([base, base], scored) == 69  # the logits at 69 predict the first scored token
    assert common_prefix_len([base], scored[:1]) == 0  # nothing to share with
    assert common_prefix_len([base, base[:MIN_PREFIX - 1] + [7] * 69], scored) == 0  # too short to be worth it
    assert shared_cost(rows, scored) == 60 + 2 * 40


def test_micro_batches_count_a_shared_prompt_once():
    from carl.train.step import TrainSequence, micro_batches

    prompt = list(range(3, 83))
    seqs = [TrainSequence(prompt + [100 + i] * 20, [False] * 80 + [True] * 20, [0.0] * 100, 1.0) for i in range(4)]
    assert [len(b) for b in micro_batches(seqs, 200)] == [2, 2]  # 100 tokens each, padded
    assert [len(b) for b in micro_batches(seqs, 200, share_prefix=True)] == [4]  # 80 + 4 x 20


@pytest.mark.parametrize("sd_loss", ["topk", "sampled"])
def test_self_distillation_reads_the_same_logits_with_a_shared_prompt(tiny_dir, sd_loss, monkeypatch):
    """The student logits at the error turns (ScoredLogits, indexed by position in the whole
    sequence) are the same whether the rollouts' common prompt ran once or per sequence."""
    from carl.train import prefix

    monkeypatch.setattr(prefix, "MIN_PREFIX", 1)  # the fixture's prompt is short
    tok = tiny_tokenizer()
    group = [solved_rollout(tok), failed_rollout(tok)]
    cfg = RLConfig(route_by_outcome=True, sd_weight=0.5, sd_loss=sd_loss, sd_topk=8)
    shared_metrics, shared = _deltas(tiny_dir, [group], cfg=cfg, tokenizer=tok)
    full_metrics, full = _deltas(tiny_dir, [group], cfg=dataclasses.replace(cfg, share_prefix=False), tokenizer=tok)
    assert shared_metrics["rl/prefix_tokens_shared"] > 0 == full_metrics["rl/prefix_tokens_shared"]
    assert shared_metrics["loss/self_distill"] == pytest.approx(full_metrics["loss/self_distill"], rel=1e-5)
    for name in full:
        torch.testing.assert_close(shared[name], full[name], rtol=1e-4, atol=1e-6)
