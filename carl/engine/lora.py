"""LoRA through PEFT: only low-rank adapters train, and only the adapters travel to the engines.

    LoRASpec(rank, alpha, targets, top_layers)      one spec for the trainer and every engine
    attach(model, spec)        -> a PEFT model: the base frozen, adapters on `targets` (of the top
                                  `top_layers` blocks, 0 = all), B = 0 so it starts as the base
    adapter_state(model)       -> the adapters' tensors by parameter name: what the trainer publishes
                                  (carl.engine.weights) and what HFEngine's own PEFT model loads
    write_adapter(dir, state, adapter_config(peft config, base))
                               -> a PEFT adapter folder (adapter_config.json, adapter_model.safetensors):
                                  what vLLM loads at run time (a checkpoint's model/ is PEFT's own)
    load_model(adapter folder) (carl.engine.hf) loads its base and merges the adapter

Needs the `peft` package (`pip install carl-rl[lora]`); asking for LoRA without it is a one-line error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from carl.errors import UserError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


@dataclass(frozen=True)
class LoRASpec:
    rank: int
    alpha: float = 16.0
    targets: tuple[str, ...] = ()
    """Module names to adapt (PEFT target_modules); () = every linear layer but the LM head."""
    top_layers: int = 0
    """Adapters only in the last N transformer blocks; 0 = in every block."""

    def peft_config(self, model: Any) -> Any:
        n = model.config.num_hidden_layers
        layers = list(range(n - self.top_layers, n)) if 0 < self.top_layers < n else None
        return _peft().LoraConfig(r=self.rank, lora_alpha=self.alpha, lora_dropout=0.0,
                                  target_modules=list(self.targets) or linear_names(model),
                                  layers_to_transform=layers)


def linear_names(model: Any) -> list[str]:
    """The short names of the model's linear layers but the LM head (q_proj, ..., down_proj)."""
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear) and not name.endswith("lm_head")})


def attach(model: Any, spec: LoRASpec) -> Any:
    """`model` wrapped with fresh adapters (PEFT); only the adapters require gradients."""
    return _peft().get_peft_model(model, spec.peft_config(model))


def adapter_params(model: Any) -> dict[str, torch.nn.Parameter]:
    """The adapters' parameters by the PEFT model's names."""
    return {n: p for n, p in model.named_parameters() if ".lora_" in n}


def adapter_state(model: Any) -> dict[str, torch.Tensor]:
    """The adapters' tensors by the PEFT model's parameter names (detached)."""
    return {n: p.detach() for n, p in adapter_params(model).items()}


def saved_name(name: str) -> str:
    """A PEFT parameter name as PEFT writes it in adapter_model.safetensors (no adapter name)."""
    return name.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")


def write_adapter(folder: str | Path, state: dict[str, torch.Tensor], config: dict[str, Any]) -> Path:
    """A PEFT adapter folder from `state` (adapter_state's names) and its adapter_config.json
    content (`adapter_config`), written whole or not at all (a temporary folder, then a rename)."""
    import shutil

    from safetensors.torch import save_file

    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({saved_name(n): t.contiguous().cpu() for n, t in state.items()}, str(tmp / ADAPTER_WEIGHTS))
    (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def adapter_config(peft_config: Any, base: str | Path) -> dict[str, Any]:
    """adapter_config.json's content for a PEFT model's LoRA config over the base model folder `base`."""
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in peft_config.to_dict().items()}
    return {**config, "base_model_name_or_path": str(Path(base).resolve())}


def is_adapter(folder: str | Path) -> bool:
    return (Path(folder) / ADAPTER_CONFIG).is_file() and not (Path(folder) / "config.json").is_file()


def adapter_base(folder: str | Path) -> Path:
    """The base model folder an adapter folder names."""
    base = json.loads((Path(folder) / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not base or not (Path(base) / "config.json").is_file():
        raise UserError(f"LoRA adapter {str(folder)!r}: its base model {base!r} (adapter_config.json "
                        "base_model_name_or_path) is not a Hugging Face model folder here")
    return Path(base)


def load_adapter_into(model: Any, folder: str | Path) -> None:
    """Set a PEFT model's adapters from an adapter folder (a checkpoint's model/)."""
    from safetensors.torch import load_file

    _peft().set_peft_model_state_dict(model, load_file(str(Path(folder) / ADAPTER_WEIGHTS)))


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise UserError("model.lora_rank > 0 needs the `peft` package: pip install peft (or carl-rl[lora])") from None
    return peft
