"""The library in layers: read from its imports (local ones included), no module imports one from a
higher layer, and no import cycle; ``import specdec_ref`` loads no kernel."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "specdec_ref"

# Lowest first. A module may import from its own layer or a lower one.
LAYERS = [
    ("ground", {"paths", "inputs", "kv_cache", "sampling", "stats", "modules", "timing", "roofline",
                "tokenizer_compat"}),
    ("kernels", {"kernels"}),
    ("library", {"drafters", "speculative", "ngram", "uag", "eagle", "baseline", "trace", "costs", "paired",
                 "acceptance"}),
    ("tools", {"bench", "lesson_tools", "grading", "zoo", "vllm", "__main__", ""}),
    ("recipes", {"recipes"}),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    first = module.split(".")[1] if "." in module else ""
    for index, (_, names) in enumerate(LAYERS):
        if first in names:
            return index
    raise AssertionError(f"{module} is in no layer: add it to LAYERS in tests/test_layers.py")


def imports() -> dict[str, set[str]]:
    """Each specdec_ref module's imports of specdec_ref modules (a name imported from a package,
    when it is a module, counts as that module)."""
    paths = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                if target.split(".")[0] != "specdec_ref":
                    continue
                for alias in node.names:
                    found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in paths else target)
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.split(".")[0] == "specdec_ref"}
        graph[module] = found - {module}
    return graph


def test_no_module_imports_from_a_higher_layer():
    upward = [f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
              for module, targets in imports().items() for target in targets if layer_of(target) > layer_of(module)]
    assert not upward, "\n".join(upward)


def test_no_import_cycle():
    graph = imports()
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                pytest.fail("import cycle: " + " -> ".join(path[path.index(target):] + [module, target]
                                                             if target in path else path + [module, target]))
            if target not in state:
                visit(target, path + [module])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def test_importing_the_library_loads_no_kernel_and_no_tool():
    loaded = subprocess.run([sys.executable, "-c", "import sys, specdec_ref; print(' '.join(sys.modules))"],
                            capture_output=True, text=True, check=True).stdout.split()
    heavy = sorted(m for m in loaded if m.startswith(("specdec_ref.kernels", "specdec_ref.bench", "specdec_ref.zoo",
                                                       "specdec_ref.vllm", "specdec_ref.recipes")))
    assert not heavy, f"import specdec_ref loaded {heavy}"
