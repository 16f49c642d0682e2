"""Frozen config dataclasses: TOML files in, dotted command-line overrides, resolved TOML out.

Every component keeps its own frozen config dataclass next to it (one docstring or comment per
field). This module only knows how to build a (nested) dataclass from a dict, apply
`a.b.c=value` overrides, validate, and write the resolved config back as TOML.

    cfg = load_config(TrainConfig, "configs/default.toml", ["rl.lr=1e-5", "rollout.group_size=8"])
    save_config(cfg, run_dir / "config.toml")
"""

from __future__ import annotations

import dataclasses
import warnings
import math
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A config value is wrong; the message names the field, the value and what was expected."""


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    """Build dataclass `cls` from a (nested) dict, checking unknown keys and value types."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"{prefix or 'config'}: got {_show(data)}, expected a table (a mapping of names to values)"
        )
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"{prefix + '.' if prefix else ''}{unknown[0]}: unknown field of {cls.__name__}; "
            f"expected one of: {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for name, value in data.items():
        f = fields[name]
        if isinstance(value, dict) and f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()  # a parent's own defaults for a nested config (e.g. the run's
            if dataclasses.is_dataclass(default):  # episode limits) stay where a table sets other fields
                value = _deep_merge(dataclasses.asdict(default), value)
        kwargs[name] = _coerce(hints[name], value, f"{prefix}.{name}" if prefix else name)
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required field is missing
        raise ConfigError(f"{prefix or cls.__name__}: {e}") from None


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        if dataclasses.is_dataclass(value):
            return value
        return from_dict(tp, value, path)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(a, value, path)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{path}: got {_show(value)}, expected {_describe(tp)}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{path}: got {_show(value)}, expected one of {list(args)}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: got {_show(value)}, expected a list")
        inner = args[0] if args else Any
        items = [_coerce(inner, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: got {_show(value)}, expected a table (a mapping of names to values)")
        key_tp, value_tp = args or (Any, Any)
        return {_coerce(key_tp, k, path): _coerce(value_tp, v, f"{path}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{path}: got {_show(value)}, expected a finite number")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: got {_show(value)}, expected an integer")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: got {_show(value)}, expected true or false")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: got {_show(value)}, expected a string")
        return value
    return value


def _show(value: Any) -> str:
    """repr(value), cut short: an error message names the value without echoing a huge one."""
    shown = repr(value)
    return shown if len(shown) <= 100 else f"{shown[:100]}... ({len(shown)} characters)"


def _describe(tp: Any) -> str:
    """A type as a message says it: `str | None` -> "str or none"."""
    names = [getattr(a, "__name__", str(a)) for a in typing.get_args(tp)]
    return " or ".join("none" if n == "NoneType" else n for n in names)


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b=1e-5` -> (["a", "b"], 1e-05). Values parse as TOML, falling back to a plain string."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected KEY=VALUE, e.g. rl.lr=1e-5")
    key, raw = text.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        keys, value = parse_override(text)
        node = data
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: {k} is not a table")
        node[keys[-1]] = value
    return data


def split_config_args(args: list[str]) -> tuple[str | None, list[str]]:
    """A command's `[CONFIG.toml] [a.b=value ...]`: the config file (None when the first argument
    is already an override) and the overrides."""
    overrides = list(args)
    if not overrides or "=" in overrides[0]:
        return None, overrides
    path = overrides.pop(0)
    if not Path(path).is_file():
        raise ConfigError(f"config file {path!r} does not exist (expected a TOML file or KEY=VALUE overrides)")
    return path, overrides


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        try:
            data = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {str(p)!r} is not valid TOML: {e}") from None
    data = apply_overrides(data, list(overrides or []))
    return from_dict(cls, move_renamed(data, getattr(cls, "RENAMED", {})))


def move_renamed(data: dict[str, Any], renamed: dict[str, str]) -> dict[str, Any]:
    """Move values from keys a config class renamed (`RENAMED`: old dotted key -> new one) to their
    new place, with a warning; both set is an error."""
    for old, new in renamed.items():
        *old_path, old_key = old.split(".")
        node = data
        for k in old_path:
            node = node.get(k) if isinstance(node, dict) else None
        if not isinstance(node, dict) or old_key not in node:
            continue
        value = node.pop(old_key)
        *new_path, new_key = new.split(".")
        target = data
        for k in new_path:
            target = target.setdefault(k, {})
        if new_key in target:
            raise ConfigError(f"{old}: renamed to {new}, and both are set; keep {new}")
        target[new_key] = value
        warnings.warn(f"config key {old} is now {new}", stacklevel=2)
    return data


def to_toml(cfg: Any) -> str:
    """Serialise a (nested) dataclass as TOML. None values are omitted (TOML has no null)."""
    d = dataclasses.asdict(cfg)
    lines: list[str] = []
    _emit(d, [], lines)
    return "\n".join(lines).strip() + "\n"


def _emit(d: dict[str, Any], path: list[str], lines: list[str]) -> None:
    scalars = {k: v for k, v in d.items() if not isinstance(v, dict) and v is not None}
    tables = {k: v for k, v in d.items() if isinstance(v, dict)}
    if path and (scalars or not tables):
        lines.append(f"\n[{'.'.join(path)}]")
    for k, v in scalars.items():
        lines.append(f"{k} = {toml_value(v)}")
    for k, v in tables.items():
        _emit(v, path + [k], lines)


def toml_value(v: Any) -> str:
    """A value as TOML writes it (and an override `key=VALUE` parses it back)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise ConfigError(f"cannot write {v!r} as TOML")


def save_config(cfg: Any, path: str | Path) -> None:
    from carl.io import atomic_write_text

    atomic_write_text(Path(path), to_toml(cfg))
