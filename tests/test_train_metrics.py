"""MetricsLog: append-only metrics.jsonl, transcripts, and PNG plots of the series present."""

import json

import pytest

from carl.train.metrics import PLOTS, MetricsLog, git_revision

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_metrics_jsonl_transcripts_and_png_plots(tmp_path):
    log = MetricsLog(tmp_path)
    log.log(-1, {"loss/sft": 2.5})
    for step in (1, 2, 3):
        log.log(step, {"rl/reward_mean": 0.1 * step, "rl/pass_rate": 0.2 * step, "loss/total": 1.0 / step,
                       "loss/grpo": 0.5 / step, "rl/tokens_per_episode": 100 + step})
    log.transcript(3, "task_a", "<|im_start|>assistant\nhello")

    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [-1, 1, 2, 3]
    assert log.rows()[2] == {"step": 2, "rl/reward_mean": 0.2, "rl/pass_rate": 0.4, "loss/total": 0.5,
                             "loss/grpo": 0.25, "rl/tokens_per_episode": 102}
    assert (tmp_path / "transcripts" / "step00003_task_a.txt").read_text().endswith("hello")

    written = log.plot()
    names = sorted(p.name for p in written)
    assert names == ["loss.png", "pass_rate.png", "reward.png", "tokens.png"]  # no tool-error series logged
    assert set(names) < set(PLOTS)
    for p in written:
        assert p.read_bytes()[:8] == PNG_MAGIC and p.stat().st_size > 1000
    assert not list((tmp_path / "plots").glob(".*tmp*"))  # written atomically
    # a refresh draws only the plots whose series changed, and any PNG that went missing
    assert log.plot() == []
    log.log(3, {"eval/pass@1": 0.5})
    assert sorted(p.name for p in log.plot()) == ["pass_rate.png", "reward.png"]
    (tmp_path / "plots" / "loss.png").unlink()
    (tmp_path / "plots" / ".plots.json").write_text("{torn")
    assert sorted(p.name for p in log.plot()) == names  # an unreadable record: everything again


def test_git_revision_outside_a_checkout(tmp_path):
    assert git_revision(tmp_path).startswith("unknown")


def test_rewind_keeps_the_rows_a_checkpoint_had_seen_and_drops_a_torn_line(tmp_path):
    log = MetricsLog(tmp_path)
    assert log.rewind(0) == 0 and not log.path.exists()  # a fresh run: nothing to rewind
    for step in (0, 1, 2):
        log.log(step, {"rl/reward_mean": 0.1 * step})
    with open(log.path, "a") as f:
        f.write('{"step": 3, "rl/rew')  # a crash mid-write
    assert log.rewind(2) == 1  # the checkpoint had seen steps 0 and 1; step 2 runs again
    log.log(2, {"rl/reward_mean": 0.5})
    assert [(r["step"], r["rl/reward_mean"]) for r in log.rows()] == [(0, 0.0), (1, 0.1), (2, 0.5)]
    assert log.rewind(3) == 0 and len(log.path.read_text().splitlines()) == 3


def test_a_tracker_that_is_not_installed_is_a_one_line_error_naming_the_package(tmp_path, monkeypatch):
    import builtins

    from carl.errors import UserError

    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(UserError, match="pip install wandb"):
        MetricsLog(tmp_path, ("wandb",))
    with pytest.raises(UserError, match="tracking: got 'mlflow'"):
        MetricsLog(tmp_path, ("mlflow",))
