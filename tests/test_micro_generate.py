import subprocess
import sys

import pytest

from carl.micro.generate import generate_repo


def test_same_seed_same_bytes(tmp_path):
    a = generate_repo(tmp_path / "a", seed=3, difficulty=2)
    b = generate_repo(tmp_path / "b", seed=3, difficulty=2)
    files_a = sorted(p.relative_to(a.root) for p in a.root.rglob("*.py"))
    assert files_a == sorted(p.relative_to(b.root) for p in b.root.rglob("*.py"))
    for rel in files_a:
        assert (a.root / rel).read_bytes() == (b.root / rel).read_bytes()
    c = generate_repo(tmp_path / "c", seed=4, difficulty=2)
    assert c.definitions != a.definitions or any(
        (a.root / r).read_bytes() != (c.root / r).read_bytes() for r in files_a if (c.root / r).exists()
    )


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_generated_suite_passes(tmp_path, difficulty):
    repo = generate_repo(tmp_path / "r", seed=11, difficulty=difficulty)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=repo.root,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(repo.definitions)} passed" in out.stdout


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="difficulty: got 7"):
        generate_repo(tmp_path / "x", seed=1, difficulty=7)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(ValueError, match="is not empty"):
        generate_repo(tmp_path / "full", seed=1)
