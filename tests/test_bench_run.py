"""`carl bench run` and `carl bench grade --suite` on a real tiny suite (built by `carl bench build`):
an OpenAI-compatible endpoint (a local HTTP server replying with the scripted expert on some
tasks and giving up on the others) scores exactly as scripted, with its token counts priced; a
killed run resumes without scoring any sample twice; a tiny random model checkpoint runs the
smoke subset; a hand-made predictions file grades exactly as constructed."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from bench_fixture import build_suite, write_suite_files
from tiny_hf import save_tiny_model

from carl.cli import main
from carl.eval.strata import mean_interval, wilson_interval
from carl.eval.suite import open_suite
from carl.harness.prompts import SUMMARY_REQUEST
from carl.micro.expert import ExpertPolicy

pytestmark = pytest.mark.filterwarnings("ignore:carl. the .local. sandbox")
FINISH = '<tool name="finish"><message>I give up.</message></tool>'


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    root = tmp_path_factory.mktemp("suite")
    write_suite_files(root)
    code, _ = build_suite(root, root / "suite")
    assert code == 0
    return root / "suite"


class Endpoint:
    """An OpenAI-compatible chat endpoint: the scripted expert on the tasks in `solve`, finish at
    once on the others; usage = characters / 4 (prompt), characters / 4 + 1 (completion)."""

    def __init__(self, tasks, solve):
        self.tasks, self.solve, self.starts = tasks, set(solve), []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                reply, usage = endpoint.reply(body["messages"])
                data = json.dumps({"choices": [{"message": {"role": "assistant", "content": reply}}],
                                   "usage": usage}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"

    def reply(self, messages):
        task = next(t for t in self.tasks if any(t.problem_statement in m["content"] for m in messages[:2]))
        step = sum(m["role"] == "assistant" for m in messages)
        if step == 0:
            self.starts.append(task.instance_id)
        if task.instance_id in self.solve:
            expert = ExpertPolicy(task)
            expert.step = step
            reply = expert.reply(messages[-1]["content"] == SUMMARY_REQUEST)
        else:
            reply = FINISH
        return reply, {"prompt_tokens": sum(len(m["content"]) for m in messages) // 4,
                       "completion_tokens": len(reply) // 4 + 1}


@pytest.fixture(scope="module")
def endpoint(suite):
    tasks = open_suite(suite).tasks
    e = Endpoint(tasks, [t.instance_id for t in tasks[::2]])  # tasks 0, 2, 4 solved
    yield e
    e.server.shutdown()


def _run(suite, endpoint, out, *extra):
    return main(["bench", "run", "--suite", str(suite), "--policy", f"openai:{endpoint.url}#scripted", "--samples", "2",
                 "--sandbox", "local", "--workers", "3", "--temperature", "0", "--price", "0.5,2",
                 "--name", "scripted", "--out", str(out), *extra])


@pytest.fixture(scope="module")
def ran(suite, endpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "results.json"
    assert _run(suite, endpoint, out) == 0
    return out, json.loads(out.read_text())


def test_a_run_scores_exactly_as_the_scripted_endpoint_plays(suite, endpoint, ran):
    _, result = ran
    s = result["summary"]
    assert result["kind"] == "run" and s["name"] == "scripted" and s["suite"] == "tiny"
    assert (s["num_tasks"], s["n"], s["samples"], s["passed"]) == (6, 6, 12, 6)
    assert s["pass@1"] == pytest.approx(0.5) and s["pass@k"] == pytest.approx(0.5)
    assert s["ci95"] == pytest.approx(list(wilson_interval(3, 6)))  # tasks all-or-nothing: n_eff = 6 tasks
    for t in result["tasks"]:
        assert t["outcomes"] == ("11" if t["task_id"] in endpoint.solve else "00"), t
        assert t["monitor_flags"] == {} and t["tokens_counted"]
    assert s["flagged"] == 0 and s["monitor_flags"] == {} and s["monitor_action"] == "zero"
    assert sorted(endpoint.starts) == sorted(t["task_id"] for t in result["tasks"] for _ in range(2))
    assert set(result["strata"]) == {"deletion_kind", "size_lines", "size_files", "fail_to_pass", "repo"}
    assert result["strata"]["repo"]["mini"]["pass@1"] == pytest.approx(0.5)


def test_cost_comes_from_the_endpoints_token_counts_and_the_price(ran):
    out, result = ran
    samples = [json.loads(line) for line in open(str(out) + ".partial.jsonl")]
    assert len(samples) == 12 and all(s["input_tokens"] > 0 and s["generated_tokens"] > 0 for s in samples)
    total = sum(s["input_tokens"] * 0.5 + s["generated_tokens"] * 2 for s in samples) / 1e6
    assert result["summary"]["total_cost_usd"] == pytest.approx(total)
    assert result["summary"]["cost_per_task_usd"] == pytest.approx(total / 12)  # 2 samples a task, 6 tasks
    assert result["summary"]["price"] == {"input_usd_per_mtok": 0.5, "output_usd_per_mtok": 2.0}


def test_a_killed_run_resumes_and_scores_no_sample_twice(suite, endpoint, ran, tmp_path):
    first_out, first = ran
    out = tmp_path / "results.json"
    lines = open(str(first_out) + ".partial.jsonl").read().splitlines(keepends=True)
    (tmp_path / "results.json.partial.jsonl").write_text("".join(lines[:7]) + lines[7][:40])  # killed mid-line
    endpoint.starts.clear()
    assert _run(suite, endpoint, out) == 0
    assert len(endpoint.starts) == 5  # the 5 samples not recorded, and only those
    again = json.loads(out.read_text())
    assert [t["outcomes"] for t in again["tasks"]] == [t["outcomes"] for t in first["tasks"]]
    assert again["summary"]["pass@1"] == first["summary"]["pass@1"] and again["summary"]["sampled_now"] == 5
    endpoint.starts.clear()
    assert _run(suite, endpoint, out) == 0 and endpoint.starts == []  # complete: nothing runs
    # the same --out with other settings is another run: refused, not mixed
    assert _run(suite, endpoint, out, "--max-turns", "3") == 2


def test_ray_actors_score_exactly_as_the_threads_did(suite, endpoint, ran, tmp_path, monkeypatch):
    """--ray: two local Ray actors (their own policy, sandboxes) run every sample once and score as the
    in-process run did; the in-process path is disabled here, so the samples can only come from them."""
    ray = pytest.importorskip("ray")
    import carl.eval.bench

    def no_threads(*args, **kwargs):
        raise AssertionError("--ray ran the samples in this process")

    monkeypatch.setattr(carl.eval.bench, "run_samples", no_threads)
    # a cluster of its own: a bare ray.init() joins the one another test's ray.cluster_utils.Cluster announces
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    endpoint.starts.clear()
    out = tmp_path / "ray.json"
    try:
        assert _run(suite, endpoint, out, "--ray", "--ray-actors", "2") == 0
    finally:
        ray.shutdown()
    _, first = ran
    result = json.loads(out.read_text())
    assert [t["outcomes"] for t in result["tasks"]] == [t["outcomes"] for t in first["tasks"]]
    assert sorted(endpoint.starts) == sorted(t["task_id"] for t in result["tasks"] for _ in range(2))
    assert result["summary"]["ray_actors"] == 2 and result["summary"]["pass@1"] == first["summary"]["pass@1"]


def test_bad_ray_arguments_are_one_line_errors(suite, endpoint, tmp_path, capsys):
    for extra, expected in ((("--ray-actors", "0"), "--ray-actors: got 0"),
                            (("--ray-cpus-per-actor=-1",), "--ray-cpus-per-actor: got -1"),
                            (("--ray", "nohost"), "--ray: got 'nohost'")):
        assert _run(suite, endpoint, tmp_path / "x.json", *extra) == 2
        err = capsys.readouterr().err
        assert expected in err and "Traceback" not in err, err


def test_a_partial_file_of_another_run_is_refused_clearly(suite, endpoint, ran, tmp_path, capsys):
    out, _ = ran
    bad = tmp_path / "r.json"
    (tmp_path / "r.json.partial.jsonl").write_text(open(str(out) + ".partial.jsonl").read())
    assert _run(suite, endpoint, bad, "--seed", "7") == 2
    err = capsys.readouterr().err
    assert "is a sample of another run" in err and "Traceback" not in err


def test_bad_run_arguments_are_one_line_errors(suite, endpoint, tmp_path, capsys):
    for extra, expected in ((("--price", "1"), "--price: got '1', expected IN,OUT"),
                            (("--price=-1,2",), "--price: got '-1,2'"),
                            (("--fail-below", "2"), "--fail-below: got 2.0"),
                            (("--workers", "0"), "--workers: got 0")):
        assert _run(suite, endpoint, tmp_path / "x.json", *extra) == 2
        err = capsys.readouterr().err
        assert expected in err and "Traceback" not in err, err
    assert main(["bench", "run", "--suite", str(suite), "--policy", "nope", "--out", str(tmp_path / "y.json")]) == 2


def test_a_ci_gate_fails_below_its_threshold(suite, endpoint, ran, tmp_path):
    out, _ = ran
    assert main(["bench", "report", str(out), "--fail-below", "0.6"]) == 3
    assert main(["bench", "report", str(out), "--fail-below", "0.5"]) == 0


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from carl.engine.hf import load_model
    from carl.train.checkpoint import save_checkpoint

    torch.set_num_threads(1)
    tokenizer, model = load_model(save_tiny_model(tmp_path_factory.mktemp("tiny")), torch.float32)
    return save_checkpoint(tmp_path_factory.mktemp("run"), 3, model, tokenizer, None, None, {"rl_step": 3})


def test_a_tiny_checkpoint_runs_the_smoke_subset(suite, checkpoint, tmp_path):
    out = tmp_path / "smoke.json"
    assert main(["bench", "run", "--suite", str(suite), "--smoke", "--checkpoint", str(checkpoint), "--samples", "1",
                 "--max-turns", "2", "--max-new-tokens", "8", "--sandbox", "local", "--price", "1,1",
                 "--out", str(out)]) == 0
    s = json.loads(out.read_text())["summary"]
    assert s["smoke"] and s["num_tasks"] == 2 and s["n"] == 2 and s["name"] == "step_000003"
    assert s["tokens_per_task"] > 0 and s["input_tokens_per_task"] > s["tokens_per_task"]  # counted from token ids
    assert s["cost_per_task_usd"] == pytest.approx((s["input_tokens_per_task"] + s["tokens_per_task"]) / 1e6)


def _grade_hand_made(suite, tmp_path, *extra):
    """Gold patches for tasks 0, 1 and 3, empty ones for 2 and 4, none for 5: 3 of 6 resolved."""
    tasks = open_suite(suite).tasks
    rows = [{"instance_id": t.instance_id, "model_patch": t.patch if i in (0, 1, 3) else ""}
            for i, t in enumerate(tasks) if i != 5]
    preds = tmp_path / "preds.jsonl"
    preds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "grade.json"
    assert main(["bench", "grade", "--suite", str(suite), "--predictions", str(preds), "--sandbox", "local",
                 "--out", str(out), "--workers", "3", *extra]) == 0
    result = json.loads(out.read_text())
    statuses = [t["status"] for t in result["tasks"]]
    assert statuses == ["resolved", "resolved", "empty", "resolved", "empty", "missing"]
    s = result["summary"]
    assert (s["resolved"], s["n"], s["pass@1"], s["suite"]) == (3, 6, 0.5, "tiny")
    assert s["ci95"] == pytest.approx(list(wilson_interval(3, 6)))
    assert result["strata"]["repo"]["mini"]["resolved"] == 3 and "size_files" in result["strata"]


def test_grading_a_suite_scores_a_hand_made_predictions_file_exactly(suite, tmp_path):
    _grade_hand_made(suite, tmp_path)


def test_grading_on_ray_actors_scores_the_same(suite, tmp_path, monkeypatch):
    """--ray: the grades come from two local Ray actors (the in-process grader is disabled here)."""
    ray = pytest.importorskip("ray")
    import carl.eval.grade

    def no_local_grades(*args, **kwargs):
        raise AssertionError("--ray graded in this process")

    monkeypatch.setattr(carl.eval.grade, "grade_prediction", no_local_grades)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        _grade_hand_made(suite, tmp_path, "--ray", "--ray-actors", "2")
    finally:
        ray.shutdown()


def test_mean_interval_is_wilsons_with_one_sample_and_narrows_with_agreeing_samples():
    assert mean_interval([1.0, 0.0, 1.0, 0.0], 4) == pytest.approx(wilson_interval(2, 4))
    lo, hi = mean_interval([0.5] * 4, 16)  # every task half: 16 samples' worth
    assert (lo, hi) == pytest.approx(wilson_interval(8, 16))
    assert mean_interval([], 0) == (0.0, 1.0) and mean_interval([0.0, 0.0], 8) == pytest.approx(wilson_interval(0, 2))
