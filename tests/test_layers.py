"""The import rules of the package (docs/architecture.md): pure math ← components ← Lightning layer ←
trainers/CLI. Every import inside ``comlrl_lightning`` (top-level or inside a function) may only point to
the same or a lower layer; modules and data modules never import callbacks; no callback imports another; no
import circle, deferred imports included; no private name (``_x``) imported from another file.
"""

from __future__ import annotations

import ast
from pathlib import Path

import comlrl_lightning

PKG = Path(comlrl_lightning.__file__).resolve().parent
ROOT = PKG.parent

PURE, COMPONENT, LIGHTNING, TOP = 0, 1, 2, 3
NAMES = {PURE: "pure math", COMPONENT: "components", LIGHTNING: "Lightning layer", TOP: "trainers/CLI"}

# Files of the pure layer: tensors and numbers in, tensors and numbers out; no models, no I/O of ours.
PURE_MODULES = {"losses", "logprobs", "protocols", "multiturn.tree"}


def layer_of(module: str) -> int:
    """Layer of a dotted module name relative to the package (``modules.madpo``, ``config``, ...)."""
    if module in PURE_MODULES:
        return PURE
    head = module.split(".")[0]
    if head in ("trainers", "cli", "__main__", "__init__", ""):
        return TOP
    if head in ("modules", "callbacks") or (head == "data" and module != "data.sources"):
        return LIGHTNING
    return COMPONENT


def package_files() -> dict[str, Path]:
    """Dotted module name (relative to the package) → file, for every .py of the package."""
    out = {}
    # ``comlrl_lightning/callbacks`` is a symlink to the top-level ``callbacks/`` folder: list it explicitly
    paths = sorted(PKG.rglob("*.py")) + [PKG / "callbacks" / p.name for p in sorted((PKG / "callbacks").glob("*.py"))]
    for path in dict.fromkeys(paths):
        rel = path.relative_to(PKG).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1] or ["__init__"]
        out[".".join(parts)] = path
    return out


def imports_of(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, imported module relative to the package) for every import of our package in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join(base + ([node.module] if node.module else []))
                names = ["comlrl_lightning." + target if target else "comlrl_lightning"]
            else:
                names = [node.module or ""]
        else:
            continue
        if isinstance(node, ast.ImportFrom):  # ``from pkg import submodule`` imports the submodule
            names = names + [f"{names[0]}.{a.name}" for a in node.names]
        for name in names:
            if name == "comlrl_lightning" or name.startswith("comlrl_lightning."):
                found.append((node.lineno, name[len("comlrl_lightning."):] if "." in name else ""))
    return found


def resolve(target: str, files: dict[str, Path]) -> str:
    """The longest known module that ``target`` names (``config.MADPOConfig`` style names are cut back)."""
    parts = target.split(".")
    while parts and ".".join(parts) not in files:
        parts.pop()
    return ".".join(parts)


def test_imports_follow_the_layers():
    files = package_files()
    bad = []
    for module, path in files.items():
        own = layer_of(module)
        for line, target in imports_of(module, path):
            target = resolve(target, files)
            if not target or target == module:
                continue
            where = f"{path.relative_to(ROOT)}:{line} imports comlrl_lightning.{target}"
            if layer_of(target) > own:
                bad.append(f"{where} ({NAMES[layer_of(target)]}) from the {NAMES[own]}")
            head, target_head = module.split(".")[0], target.split(".")[0]
            if target_head == "callbacks" and head in ("modules", "data"):
                bad.append(f"{where}: modules and data modules never import callbacks")
            if head == "callbacks" and target_head == "callbacks" and module != "callbacks":
                bad.append(f"{where}: a callback never imports another callback")
    assert not bad, "Imports against the layer rule:\n" + "\n".join(bad)


def test_the_rule_catches_an_upward_import(tmp_path):
    """The checker itself: an upward import in a pure file is reported."""
    path = tmp_path / "losses.py"
    path.write_text("from comlrl_lightning.modules.madpo import MADPOModule\n")
    files = package_files()
    (line, target), _ = imports_of("losses", path)
    assert layer_of(resolve(target, files)) > layer_of("losses")


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Module → the package modules it imports (top-level or deferred)."""
    graph = {}
    for module, path in files.items():
        targets = {resolve(t, files) for _, t in imports_of(module, path)}
        graph[module] = {t for t in targets if t in files and t != module}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    circles.append(sorted(group))
    return circles


def test_no_import_circle():
    circles = import_circles(import_graph(package_files()))
    assert not circles, "Import circles (each group imports itself through the others):\n" + "\n".join(
        " <-> ".join(group) for group in circles)


def test_the_circle_finder_sees_a_deferred_import(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": set(), "d": set()}
    assert import_circles(graph) == []
    graph["c"].add("a")  # c imports a inside a function: still a circle
    assert import_circles(graph) == [["a", "b", "c"]]
    path = tmp_path / "gguf.py"
    path.write_text("def f():\n    from comlrl_lightning.agents import load_model\n")
    assert imports_of("gguf", path) == [(2, "agents"), (2, "agents.load_model")]


def test_no_private_name_is_imported_from_another_file():
    bad = []
    for path in package_files().values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("comlrl_lightning"):
                bad += [f"{path.relative_to(ROOT)}:{node.lineno} imports {a.name} from {node.module}"
                        for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert not bad, "Private names imported across files (make them public or keep them in one file):\n" + \
        "\n".join(bad)
