"""Fakes shared by the agent-loop tests: an in-memory sandbox and a tiny chat tokenizer built in code."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from carl.sandbox.base import ExecResult, FileEntry, SandboxError, SandboxPathError

CHATML_TEMPLATE = (  # SmolLM2's template without its default system message
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = """\
<tool name="read_file"><path>src/app.py</path></tool> <tool name="write_file"><path>a.py</path>
<content>def add(a, b):\n    return a + b\n</content></tool> <tool name="finish"></tool>
<result index="0" tool="read_file"> the quick brown fox jumps over the lazy dog. Summary: I read the
files, fixed the bug in add, and the tests pass. Your context is nearly full; continue the task.
"""


class FakeSandbox:
    """Files in a dict; `exec` is not supported. `crash=True` makes every file access a SandboxError."""

    workdir = "/workspace"

    def __init__(self, files: dict[str, str] | None = None, crash: bool = False):
        self.files = {k: v.encode() for k, v in (files or {}).items()}
        self.crash = crash
        self.closed = False

    def exec(self, command: str | Sequence[str], *, timeout_s: float | None = None, cwd: str = ".",
             env: dict[str, str] | None = None, stdin: str | None = None) -> ExecResult:
        raise SandboxError("FakeSandbox does not run commands")

    def read_file(self, path: str) -> bytes:
        self._check()
        if path not in self.files:
            raise SandboxPathError(f"{path}: no such file")
        return self.files[path]

    def write_file(self, path: str, data: bytes) -> None:
        self._check()
        self.files[path] = data

    def list_files(self, path: str = ".", recursive: bool = False) -> list[FileEntry]:
        self._check()
        return [FileEntry(p, False, len(d)) for p, d in sorted(self.files.items())]

    def close(self) -> None:
        self.closed = True

    def _check(self) -> None:
        if self.crash:
            raise SandboxError("the sandbox died")


def file_tools() -> dict:
    from carl.harness.tools.files import ReadFile, WriteFile
    from carl.harness.tools.finish import Finish

    return {t.spec.name: t for t in (ReadFile(), WriteFile(), Finish())}


def tiny_chat_tokenizer(folder: Path, template: str = CHATML_TEMPLATE):
    """A byte-level BPE tokenizer trained in code, with a ChatML template, saved and reloaded
    through the real loading path (AutoTokenizer.from_pretrained)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = template
    fast.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)
