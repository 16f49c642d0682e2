"""`carl train` rejects bad configs before any work, with exit code 2 and one line naming the field."""

import pytest

from carl.cli import main


@pytest.mark.parametrize(
    "override, field",
    [
        ("rl.lr=abc", "rl.lr"),
        ("rl.lr=-1", "rl.lr"),
        ("rl.sd_loss=foo", "rl.sd_loss"),
        ("shaping.tool_error_cost=-0.1", "shaping.tool_error_cost"),
        ("rollout.stale=never", "rollout.stale"),
        ("rollout.workers=k8s", "rollout.workers"),
        ("engine.kind=tgi", "engine.kind"),
        ("engine.kv_cache_gb=0", "engine.kv_cache_gb"),
        ("rl.kl_coef=-1", "rl.kl_coef"),
        ("rl.no_such_knob=1", "no_such_knob"),
        ("rollout.group_size=1", "rollout.group_size"),
        ("model.dtype=fp8", "model.dtype"),
    ],
)
def test_bad_override_exits_2_with_one_line_naming_the_field(override, field, tmp_path, capsys):
    code = main(["train", f"run_dir={tmp_path / 'run'}", override])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and field in err, err
    assert not (tmp_path / "run").exists()  # nothing was started


def test_missing_config_file_is_a_user_error(tmp_path, capsys):
    assert main(["train", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml" in capsys.readouterr().err
