import subprocess
import sys

import pytest

from carl.micro.generate import LEVELS, generate_repo


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


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4, 5])
def test_generated_suite_passes(tmp_path, difficulty):
    repo = generate_repo(tmp_path / "r", seed=11, difficulty=difficulty)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=repo.root,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(repo.definitions)} passed" in out.stdout


@pytest.mark.parametrize("difficulty", [4, 5])
def test_reading_levels_keep_the_answer_out_of_the_docstring(tmp_path, difficulty):
    """At levels 4-5 a docstring names a rule in words; what the body needs is elsewhere: constants of
    the module (level 4) or of the settings module (level 5), or a sibling function it calls."""
    import ast
    import re

    for seed in range(6):
        repo = generate_repo(tmp_path / f"r{seed}", seed=seed, difficulty=difficulty, num_modules=3)
        settings = repo.root / repo.package / "settings.py"
        assert settings.exists() == (difficulty == 5)
        for module in (repo.root / repo.package).glob("*.py"):
            if module.name in ("__init__.py", "settings.py"):
                continue
            tree = ast.parse(module.read_text())
            assigns = [n for n in tree.body if isinstance(n, ast.Assign)]
            assert bool(assigns) == (difficulty == 4)  # level 5: constants live in settings.py only
            for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
                doc = ast.get_docstring(fn)
                assert not re.search(r"\d|'|[A-Z]{2}", doc), (fn.name, doc)  # no value, no constant's name
                body = ast.unparse(fn.body[1:])
                assert re.search(r"\b[A-Z]+_[A-Z]+\b", body) or re.search(r"\w+_\w+\(", body), body


def test_reading_tests_do_not_let_a_constant_answer_pass(tmp_path):
    """Every test's asserts expect at least two different values (a `return True` fails them)."""
    import re

    for seed in range(8):
        repo = generate_repo(tmp_path / f"r{seed}", seed=seed, difficulty=4, num_modules=3, defs_per_module=4)
        for test in (repo.root / "tests").glob("test_*.py"):
            for body in test.read_text().split("\n\n\ndef ")[1:]:
                expected = re.findall(r"== (.+)$", body, re.M)
                assert len(expected) == 3 and len(set(expected)) >= 2, body


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="difficulty: got 7"):
        generate_repo(tmp_path / "x", seed=1, difficulty=7)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(ValueError, match="is not empty"):
        generate_repo(tmp_path / "full", seed=1)


@pytest.mark.parametrize("level", LEVELS)
def test_templates_of_a_level_names_every_template_its_repos_have(level, tmp_path):
    import re

    from carl.micro.generate import templates_of

    seen = set()
    for seed in range(6):
        repo = generate_repo(tmp_path / str(seed), seed=seed, difficulty=level)
        seen |= {re.split(r"[.:]", d)[-1].rsplit("_", 1)[0] for d in repo.definitions if not d.split(".")[-1][0].isupper()}
    assert seen <= set(templates_of(level)) and len(seen) >= 4
