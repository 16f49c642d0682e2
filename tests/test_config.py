from dataclasses import dataclass, field

import pytest

from carl.config import ConfigError, from_dict, load_config, parse_override, save_config, to_toml


@dataclass(frozen=True)
class Inner:
    lr: float = 1e-4
    steps: int = 10


@dataclass(frozen=True)
class Outer:
    name: str = "run"
    inner: Inner = field(default_factory=Inner)
    tags: tuple[str, ...] = ()
    seed: int | None = None


def test_overrides_and_roundtrip(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('name = "a"\n[inner]\nsteps = 3\n')
    cfg = load_config(Outer, p, ["inner.lr=2e-5", "tags=['x','y']", "seed=7"])
    assert cfg == Outer(name="a", inner=Inner(lr=2e-5, steps=3), tags=("x", "y"), seed=7)
    save_config(cfg, tmp_path / "out.toml")
    assert load_config(Outer, tmp_path / "out.toml") == cfg


def test_errors_name_the_field():
    with pytest.raises(ConfigError, match="inner.steps: got 'many', expected an integer"):
        from_dict(Outer, {"inner": {"steps": "many"}})
    with pytest.raises(ConfigError, match="inner.lrr: unknown field of Inner"):
        from_dict(Outer, {"inner": {"lrr": 1.0}})
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        parse_override("inner.lr")


def test_override_string_fallback():
    assert parse_override("name=hello world") == (["name"], "hello world")
    assert "[inner]" in to_toml(Outer())


@dataclass(frozen=True)
class Typed:
    rate: float = 1.0
    env: dict[str, str] = field(default_factory=dict)
    path: str | None = None


@pytest.mark.parametrize(
    "data, message",
    [
        ({"rate": float("nan")}, "rate: got nan, expected a finite number"),
        ({"rate": float("inf")}, "rate: got inf, expected a finite number"),
        ({"env": {"A": 1}}, "env.A: got 1, expected a string"),
        ({"env": [1]}, "env: got [1], expected a table"),
        ({"path": 5}, "path: got 5, expected str or none"),
    ],
)
def test_wrong_values_name_the_field_the_value_and_what_was_expected(data, message):
    with pytest.raises(ConfigError) as e:
        from_dict(Typed, data)
    assert str(e.value).startswith(message), str(e.value)


def test_a_huge_value_is_cut_short_in_the_message():
    with pytest.raises(ConfigError) as e:
        from_dict(Typed, {"rate": "x" * 100_000})
    assert len(str(e.value)) < 300 and "100002 characters" in str(e.value)
