"""Bad input on the command line and in files gets one line naming what was wrong, and a non-zero
exit; never a traceback, never a run that starts anyway."""

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from safetensors import SafetensorError

from carl.cli import main
from carl.io import append_jsonl, read_jsonl

GOOD = {"instance_id": "r__1-function-stub-abc", "repo": "r", "FAIL_TO_PASS": ["tests/test_a.py::test_a"]}
ROOT = Path(__file__).resolve().parents[1]


def _one_line_error(capsys) -> str:
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, out.err
    return lines[0]


# ---- carl train: every numeric field of the config is checked before anything runs


@pytest.mark.parametrize(
    "override, shown",
    [
        ("rl.steps=-1", "rl.steps: got -1"),
        ("rl.lr=nan", "rl.lr: got nan"),
        ("rl.max_wall_s=inf", "rl.max_wall_s: got inf"),
        ("rl.grad_clip=0", "rl.grad_clip: got 0"),
        ("rl.weight_decay=-0.1", "rl.weight_decay: got -0.1"),
        ("rl.grpo_weight=-1", "rl.grpo_weight: got -1"),
        ("rl.sd_weight=-1", "rl.sd_weight: got -1"),
        ("rl.sd_topk=0", "rl.sd_topk: got 0"),
        ("rl.micro_batch_tokens=0", "rl.micro_batch_tokens: got 0"),
        ("rl.clip_eps_low=1.0", "rl.clip_eps_low: got 1.0"),
        ("rl.clip_eps_high=-0.1", "rl.clip_eps_high: got -0.1"),
        ("rl.is_ratio_cap=0.5", "rl.is_ratio_cap: got 0.5"),
        ("rollout.group_size=0", "rollout.group_size: got 0"),
        ("rollout.tasks_per_step=0", "rollout.tasks_per_step: got 0"),
        ("rollout.temperature=-0.5", "rollout.temperature: got -0.5"),
        ("rollout.top_p=0", "rollout.top_p: got 0"),
        ("rollout.top_p=1.5", "rollout.top_p: got 1.5"),
        ("rollout.max_staleness=-1", "rollout.max_staleness: got -1"),
        ("rollout.concurrency=0", "rollout.concurrency: got 0"),
        ("warm_start.episodes=-1", "warm_start.episodes: got -1"),
        ("warm_start.epochs=0", "warm_start.epochs: got 0"),
        ("warm_start.batch_size=0", "warm_start.batch_size: got 0"),
        ("warm_start.lr=-1e-4", "warm_start.lr: got -0.0001"),
        ("warm_start.bad_call=1.5", "warm_start.bad_call: got 1.5"),
        ("eval.samples_per_task=0", "eval.samples_per_task: got 0"),
        ("eval.temperature=-1", "eval.temperature: got -1"),
        ("limits.max_turns=0", "limits.max_turns: got 0"),
        ("limits.max_new_tokens=-5", "limits.max_new_tokens: got -5"),
        ("limits.max_tokens=0", "limits.max_tokens: got 0"),
        ("limits.context_budget_tokens=0", "limits.context_budget_tokens: got 0"),
        ("limits.wall_time_s=0", "limits.wall_time_s: got 0"),
        ("micro.difficulty=6", "micro.difficulty: got 6"),
        ("micro.rl_repos=0", "micro.rl_repos: got 0"),
        ('micro.templates=["shift","shift"]', "micro.templates: got ['shift', 'shift']"),
        ('micro.templates=["add"]', "micro.templates: got ['add'], expected distinct templates of the level-4"),
        ("model.trainable_layers=-1", "model.trainable_layers: got -1"),
        ("checkpoint_every=0", "checkpoint_every: got 0"),
        ("sandbox.timeout_s=-1", "sandbox.timeout_s: got -1"),
        ("sandbox.env={A=1}", "sandbox.env.A: got 1"),
        ("rl.steps=many", "rl.steps: got 'many'"),
    ],
)
def test_a_bad_training_value_is_one_line_and_nothing_starts(override, shown, tmp_path, capsys):
    assert main(["train", f"run_dir={tmp_path / 'run'}", override]) == 2
    line = _one_line_error(capsys)
    assert shown in line and "expected" in line, line
    assert not (tmp_path / "run").exists()


def test_the_shipped_configs_and_defaults_still_load():
    from carl.config import load_config
    from carl.midtrain.config import MidtrainConfig
    from carl.train.config import TrainConfig

    config_of = {"midtrain.toml": MidtrainConfig}  # every other shipped config is a `carl train` one
    for path in [None, *sorted((ROOT / "configs").glob("*.toml"))]:
        load_config(config_of.get(path.name if path else "", TrainConfig), path, [])


# ---- task files: one line naming the file, the line, what was wrong and what was expected


def _task_file(tmp_path: Path, *lines: bytes) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(b"".join(lines))
    return path


def _line(record) -> bytes:
    return json.dumps(record).encode() + b"\n"


BAD_LINES = [
    (b"\xff\xfe garbage\n", "not UTF-8"),
    (b'{"instance_id": "x", "repo": \n', "not valid JSON"),
    (_line({"instance_id": "x"}), "'repo'"),
    (_line({"repo": "r"}), "'instance_id'"),
    (_line({**GOOD, "FAIL_TO_PASS": 5}), "FAIL_TO_PASS"),
    (_line({**GOOD, "instance_id": 5}), "instance_id: got 5, expected a string"),
    (_line({**GOOD, "environment": [1]}), "environment: got [1], expected a JSON object"),
    (_line({**GOOD, "test_timings": {"t": "slow"}}), "test_timings: expected a JSON object of seconds"),
    (_line({**GOOD, "deletion_mode": "zap"}), "deletion_mode: got 'zap'"),
    (_line([1, 2]), "got a JSON list, expected a task record"),
]


@pytest.mark.parametrize("command", [["validate"], ["stats"], ["show", "some-id", "--tasks"]])
@pytest.mark.parametrize("bad, shown", BAD_LINES)
def test_a_bad_task_line_is_one_line_naming_file_and_line(tmp_path, capsys, command, bad, shown):
    path = _task_file(tmp_path, _line(GOOD), bad, _line(GOOD))
    assert main(["tasks", *command, str(path)]) == 2
    line = _one_line_error(capsys)
    assert f"{path}:2:" in line and shown in line, line


def test_a_torn_last_line_is_dropped_with_a_warning(tmp_path, capsys):
    path = _task_file(tmp_path, _line(GOOD), b'{"instance_id": "r__1-cla')  # a crash mid-append
    with pytest.warns(UserWarning, match=rf"{path}:2: dropped a torn last line"):
        assert main(["tasks", "stats", str(path)]) == 0
    assert "1 tasks by repo" in capsys.readouterr().out


def test_validate_on_a_file_with_no_whole_line_fails_with_a_warning(tmp_path):
    path = _task_file(tmp_path, b'{"instance_id": "r__1-cla')
    res = subprocess.run([sys.executable, "-m", "carl", "tasks", "validate", str(path)],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)  # fmt: skip
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert f"{path}:1: dropped a torn last line" in res.stderr  # the warning, as a user sees it
    assert (
        res.stderr.strip().splitlines()[-1]
        == f"carl: task file {path}: no tasks in it; expected one task record a line"
    )


def test_stats_names_a_garbled_line_of_the_drop_log(tmp_path, capsys):
    path = _task_file(tmp_path, _line(GOOD))
    drops = tmp_path / "tasks.store" / "drops.jsonl"
    drops.parent.mkdir()
    drops.write_bytes(b"{oops\n" + _line({"repo": "r", "reason": "x"}))
    assert main(["tasks", "stats", str(path)]) == 2
    assert f"{drops}:1: not valid JSON" in _one_line_error(capsys)


def test_build_names_a_garbled_line_of_the_resume_log(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    out = tmp_path / "tasks.jsonl"
    repos = tmp_path / "tasks.store" / "repos.jsonl"
    repos.parent.mkdir()
    repos.write_bytes(b"\xff\n{}\n")
    assert main(["tasks", "build", str(tmp_path / "src"), "--out", str(out)]) == 2
    assert f"{repos}:1: not UTF-8" in _one_line_error(capsys)


# ---- the JSONL files themselves


def test_an_append_after_a_crash_cuts_off_the_torn_line(tmp_path):
    path = tmp_path / "log.jsonl"
    append_jsonl(path, {"a": 1})
    with open(path, "ab") as f:
        f.write(b'{"b": 2, "c')  # a crash mid-append
    with pytest.warns(UserWarning, match="cut off a torn last line"):
        append_jsonl(path, {"d": 4})  # resuming: without the cut this line would join the torn one
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing torn is left
        assert read_jsonl(path) == [{"a": 1}, {"d": 4}]


def test_an_append_keeps_a_whole_last_line_without_its_newline(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"a": 1}')  # written by hand
    append_jsonl(path, {"b": 2})
    assert read_jsonl(path) == [{"a": 1}, {"b": 2}]


def test_a_garbled_line_before_the_last_is_an_error_not_a_torn_line(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": \n')  # newline-terminated: written whole, so not torn
    with pytest.raises(ValueError, match=rf"{path}:2: not valid JSON"):
        read_jsonl(path)


def _fake_vllm_server(monkeypatch) -> list:
    """`carl engine serve` with a VLLMServer that starts nothing and is never alive (the command
    then returns 1); the list collects the ServerSpec of each start."""
    from carl.engine import vllm_server

    specs = []

    class Server:
        def __init__(self, spec, log, max_restarts):
            specs.append(spec)
            self.url = "http://127.0.0.1:1"

        def start(self):
            pass

        def alive(self):
            return False

        def tail(self):
            return ""

        def stop(self):
            pass

    monkeypatch.setattr(vllm_server, "VLLMServer", Server)
    return specs


def test_engine_serve_passes_lora_and_route_recording_to_the_server(tmp_path, monkeypatch, capsys):
    (tmp_path / "config.json").write_text("{}")
    specs = _fake_vllm_server(monkeypatch)
    assert main(["engine", "serve", "--model", str(tmp_path), "--lora-rank", "8", "--record-routes"]) == 1
    assert specs[0].lora_rank == 8 and specs[0].record_routes
    argv = specs[0].argv(Path("python"), 1)
    assert "--enable-lora" in argv and "--no-enable-prefix-caching" in argv
    assert main(["engine", "serve", "--model", str(tmp_path), "--lora-rank", "-1"]) == 2
    assert "--lora-rank: got -1" in _one_line_error(capsys)


def test_engine_serve_computes_in_the_dtype_carl_train_would(tmp_path, monkeypatch, capsys):
    """`--dtype auto` (the default): fp32 on a CPU without native bf16 (a bf16 server there prefilled
    4.6x slower, measured) and bf16 where it is native or on a GPU; an explicit dtype is kept."""
    from carl.engine import hf, vllm_env

    (tmp_path / "config.json").write_text("{}")
    specs = _fake_vllm_server(monkeypatch)
    serve = ["engine", "serve", "--model", str(tmp_path)]
    for cuda, native, asked, expected in [(False, False, [], "float32"), (False, True, [], "bfloat16"),
                                          (True, False, [], "bfloat16"),
                                          (False, False, ["--dtype", "bfloat16"], "bfloat16"),
                                          (True, True, ["--dtype", "float32"], "float32")]:
        monkeypatch.setattr(vllm_env, "has_cuda", lambda cuda=cuda: cuda)
        monkeypatch.setattr(hf, "native_bf16", lambda device, native=native: native)
        assert main(serve + asked) == 1  # the fake server is not alive
        assert specs[-1].dtype == expected, (cuda, native, asked)
        out = capsys.readouterr().out
        assert f"in {expected} at" in out
        # only a bf16 asked for where it is not native is warned about
        assert ("warning: --dtype bfloat16 on a CPU without native bf16" in out) == (expected == "bfloat16" and
                                                                                   not (cuda or native))
        argv = specs[-1].argv(Path("python"), 1)
        assert argv[argv.index("--dtype") + 1] == expected
    with pytest.raises(SystemExit):  # argparse names the choices
        main(serve + ["--dtype", "fp16"])
    assert "--dtype: invalid choice: 'fp16'" in capsys.readouterr().err


def test_every_command_group_module_exists_and_registers_its_commands():
    """carl/cli.py skips a group whose module is missing (a partial install): a renamed or moved
    command module must not vanish from `carl --help` unnoticed."""
    import importlib

    from carl.cli import GROUPS, build_parser

    for module_name in GROUPS.values():
        assert hasattr(importlib.import_module(module_name), "register"), module_name
    commands = set(build_parser()._subparsers._group_actions[0].choices)
    for group in GROUPS:
        assert set(group.split("/")) <= commands, (group, sorted(commands))


@pytest.mark.parametrize("error", [OSError(28, "No space left on device", "/nonexistent/run/metrics.jsonl"),
                                   OSError("I/O error: No space left on device (os error 28)"),
                                   SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")])
def test_a_full_disk_in_any_command_is_one_line_naming_where(error, monkeypatch, capsys):
    """ENOSPC anywhere (not only while a checkpoint is written) ends the command with one line: where,
    how much is free, and that rerunning resumes; any other OSError stays a traceback (a bug)."""
    def full(args):
        raise error

    monkeypatch.setattr("carl.cli.build_parser", _parser_with(full))
    assert main(["fill"]) == 1
    line = _one_line_error(capsys)
    assert line.startswith("carl: no space left on the device") and "GB free now" in line and "run the same command" in line
    if getattr(error, "filename", None):
        assert "writing /nonexistent/run/metrics.jsonl" in line

    monkeypatch.setattr("carl.cli.build_parser", _parser_with(lambda args: (_ for _ in ()).throw(OSError(5, "EIO"))))
    with pytest.raises(OSError):
        main(["fill"])


def _parser_with(func):
    import argparse

    def build():
        parser = argparse.ArgumentParser(prog="carl")
        sub = parser.add_subparsers()
        sub.add_parser("fill").set_defaults(func=func)
        return parser

    return build
