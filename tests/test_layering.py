"""The harness, sandbox and tasks packages are what production use needs: they never import
torch (or anything that imports it at module level), checked both statically and at runtime. So
does the serving side of carl/online (`carl serve`: the service, store, users, workspaces, client,
signals, simulated users); the engine it serves is passed in, and `carl online`'s cycle trains."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TORCH_FREE = ["carl/harness", "carl/sandbox", "carl/tasks"]
TORCH_FREE_MODULES = ["carl.online." + m for m in ("auth", "client", "service", "signals", "simulate", "store",
                                                    "workspaces")] + ["carl.commands.online"]
HEAVY = {"torch", "transformers", "numpy", "vllm", "ray"}


def _module_level_imports(path: Path) -> set[str]:
    """Top-level module names imported at module level (not inside functions)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in tree.body:
        stack = [node]
        while stack:
            n = stack.pop()
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(n, ast.Import):
                names.update(a.name.split(".")[0] for a in n.names)
            elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
                names.add(n.module.split(".")[0])
            stack.extend(ast.iter_child_nodes(n))
    return names


@pytest.mark.parametrize("pkg", TORCH_FREE)
def test_no_torch_imports_at_module_level(pkg):
    offenders = []
    for path in sorted((ROOT / pkg).rglob("*.py")):
        bad = _module_level_imports(path) & {"torch"}
        if bad:
            offenders.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert not offenders, offenders


def test_importing_torch_free_packages_does_not_load_torch():
    mods = []
    for pkg in TORCH_FREE:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            mods.append(".".join(rel.parts).removesuffix(".__init__"))
    mods += TORCH_FREE_MODULES
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}:\n"
        "    importlib.import_module(m)\n"
        f"heavy = sorted(m for m in {sorted(HEAVY)!r} if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "torch" not in out.stdout.strip().split(","), f"torch loaded by importing {TORCH_FREE}"


# Lower layers never import higher ones. carl/commands (the command-line modules) is the application
# on top of every package: it may import any of them, and none imports it.


def _package_imports() -> dict[str, dict[str, str]]:
    """{package: {imported package: one file that imports it}} over carl's library modules."""
    edges: dict[str, dict[str, str]] = {}
    for path in sorted((ROOT / "carl").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if len(rel.parts) < 3:
            continue
        pkg = rel.parts[1]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == "carl" and len(parts) > 1 and parts[1] != pkg and (ROOT / "carl" / parts[1]).is_dir():
                    edges.setdefault(pkg, {}).setdefault(parts[1], str(rel))
    return edges


def test_packages_import_each_other_without_cycles():
    import graphlib

    edges = _package_imports()
    try:
        order = list(graphlib.TopologicalSorter({p: set(d) for p, d in edges.items()}).static_order())
    except graphlib.CycleError as e:
        cycle = e.args[1]
        raise AssertionError("package import cycle: " + " -> ".join(cycle) + " (" + "; ".join(
            f"{a} -> {b} in {edges[a][b]}" for a, b in zip(cycle, cycle[1:])) + ")") from None
    # what production use needs sits below what trains
    for low, high in [("harness", "engine"), ("sandbox", "harness"), ("rollout", "train"), ("eval", "train"),
                      ("tasks", "rollout"), ("train", "online")]:
        assert order.index(low) < order.index(high), order
    for low in ("harness", "sandbox", "tasks"):
        assert not set(edges.get(low, {})) & {"engine", "rollout", "rl", "train", "eval", "online", "midtrain"}
    assert not [p for p, d in edges.items() if "commands" in d], "a library package imports carl.commands"
