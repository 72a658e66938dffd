"""The package's layering, read from the source (no imports executed):

- pure policy (``sglang_prorsa.policy``: lifecycle -> forecast -> allocation -> planning; the workload generator; the
  simulator) imports neither SGLang, torch nor HTTP or IPC libraries, directly or through another module of ours;
- packages import only downward (``LAYERS``), function-level imports included: a lazy import is still a dependency;
- no import cycles between our modules, function-level imports included (only ``if TYPE_CHECKING:`` imports, which
  never run, are left out).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "sglang_prorsa"

PURE = ("sglang_prorsa.policy", "sglang_prorsa.workload", "sglang_prorsa.sim")
# Tools that live beside the simulator but talk to a live server or draw pictures on purpose.
PURE_EXEMPT = ("sglang_prorsa.sim.fit", "sglang_prorsa.sim.plots", "sglang_prorsa.sim.__main__")
FORBIDDEN = ("sglang", "torch", "triton", "fastapi", "starlette", "aiohttp", "requests", "httpx", "uvicorn", "zmq",
             "urllib.request", "http.client", "mooncake")

# Bottom to top; a package may import only packages on a lower line. Packages on one line are independent of each
# other. A module belongs to the longest prefix listed here; a name in PACKAGE_ONLY stands for that package's
# ``__init__`` alone, so a new module directly under it must be given a line of its own.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("sglang_prorsa.policy.horizon",),  # a constant (S's default) that config.py and the policy share
    ("sglang_prorsa", "sglang_prorsa.config", "sglang_prorsa.policy"),
    ("sglang_prorsa.policy.clock",),
    ("sglang_prorsa.policy.lifecycle",),
    ("sglang_prorsa.policy.forecast", "sglang_prorsa.policy.role_switch"),
    ("sglang_prorsa.policy.control_plane",),
    ("sglang_prorsa.workload", "sglang_prorsa.client"),
    ("sglang_prorsa.integrations",),  # trainer adapters: the client, and nothing of the server
    ("sglang_prorsa.sim",),
    ("sglang_prorsa.srt",),
    ("sglang_prorsa.srt.common",),
    ("sglang_prorsa.srt.utils",),
    ("sglang_prorsa.srt.disaggregation", "sglang_prorsa.srt.cpu_recipe"),
    ("sglang_prorsa.srt.lifecycle_routes",),
    ("sglang_prorsa.srt.scheduler",),
    ("sglang_prorsa.srt.engine",),
    ("sglang_prorsa.srt.instance",),
    ("sglang_prorsa.srt.front",),
    ("sglang_prorsa.srt.controller",),
    ("sglang_prorsa.testing",),
    ("sglang_prorsa.launch_server", "sglang_prorsa.control_plane"),
    ("sglang_prorsa.engine",),  # the in-process entry point: launch_server's settings and preparation
)


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)

PACKAGE_ONLY = ("sglang_prorsa", "sglang_prorsa.policy", "sglang_prorsa.srt")


def _nodes(tree: ast.Module, module_level_only: bool) -> list[ast.AST]:
    """Import-bearing nodes: the module's top level only, or every node; ``if TYPE_CHECKING:`` bodies never."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        out.append(node)
        if not module_level_only:
            todo.extend(ast.iter_child_nodes(node))
    return out


def imports(path: Path, module_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in _nodes(tree, module_level_only):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
                base = ".".join(pkg.split(".")[: len(pkg.split(".")) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}  # `from pkg import module`
    return out


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def internal(name: str, modules: dict[str, Path]) -> str | None:
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def is_pure(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in PURE) and not any(
        name == e or name.startswith(e + ".") for e in PURE_EXEMPT)


def test_pure_policy_imports_no_engine_torch_or_http_library():
    modules = all_modules()
    pure = [m for m in modules if is_pure(m)]
    assert len(pure) > 20, "the pure set is suspiciously small: did the layout change?"
    problems = []
    for m in pure:
        for imp in imports(modules[m], module_level_only=False):
            if any(imp == f or imp.startswith(f + ".") for f in FORBIDDEN):
                problems.append(f"{m} imports {imp}")
            target = internal(imp, modules) if imp.startswith("sglang_prorsa") else None
            if target and target != "sglang_prorsa" and not is_pure(target) and not target.endswith("__init__"):
                problems.append(f"{m} imports the non-pure {target}")
    assert not problems, "\n".join(problems)


def layer_of(module: str) -> tuple[int, str]:
    """(line in LAYERS, the package prefix) of the longest prefix of ``module`` listed there."""
    best = (-1, "")
    for rank, line in enumerate(LAYERS):
        for pkg in line:
            inside = module == pkg or (pkg not in PACKAGE_ONLY and module.startswith(pkg + "."))
            if inside and len(pkg) > len(best[1]):
                best = (rank, pkg)
    if best[0] < 0:
        raise AssertionError(f"{module} is in no layer: add its package to LAYERS")
    return best


def upward_imports(modules: dict[str, Path]) -> list[str]:
    problems = []
    for m, path in modules.items():
        rank, pkg = layer_of(m)
        for imp in imports(path, module_level_only=False):
            target = internal(imp, modules) if imp.startswith("sglang_prorsa") else None
            if target is None or target == m or m.startswith(target + "."):
                continue  # a module's own enclosing package is loaded before it anyway
            t_rank, t_pkg = layer_of(target)
            if t_pkg != pkg and t_rank >= rank:
                problems.append(f"{m} ({pkg}) imports {target} ({t_pkg}), which is not below it")
    return problems


def test_packages_import_only_downward_function_level_imports_included():
    assert not upward_imports(all_modules()), "\n".join(upward_imports(all_modules()))


def test_the_direction_check_sees_an_upward_lazy_import(tmp_path):
    low = tmp_path / "sglang_prorsa" / "policy" / "clock.py"
    high = tmp_path / "sglang_prorsa" / "srt" / "common" / "messages.py"
    low.parent.mkdir(parents=True)
    high.parent.mkdir(parents=True)
    low.write_text("def now():\n    from sglang_prorsa.srt.common import messages\n")
    high.write_text("from sglang_prorsa.policy.clock import now\n")
    found = {"sglang_prorsa.policy.clock": low, "sglang_prorsa.srt.common.messages": high}
    assert upward_imports(found) == ["sglang_prorsa.policy.clock (sglang_prorsa.policy.clock) imports "
                                     "sglang_prorsa.srt.common.messages (sglang_prorsa.srt.common), which is not "
                                     "below it"]


def test_no_import_cycles():
    modules = all_modules()
    # `from pkg import sibling` inside pkg re-enters pkg's __init__, which Python allows (it is already loading):
    # an edge from a module to one of its own enclosing packages is not a cycle.
    graph = {m: {t for i in imports(p, module_level_only=False) if i.startswith("sglang_prorsa")
                 for t in [internal(i, modules)] if t and t != m and not m.startswith(t + ".")}
             for m, p in modules.items()}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_the_checker_sees_a_forbidden_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\ndef f():\n    import torch\n    from sglang.srt import x\n")
    found = imports(bad, module_level_only=False)
    assert "torch" in found and "sglang.srt" in found and "sglang.srt.x" in found
    assert imports(bad, module_level_only=True) == {"os"}
    typed = tmp_path / "typed.py"
    typed.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\nelse:\n    import json\n")
    assert imports(typed, module_level_only=False) == {"typing", "typing.TYPE_CHECKING", "json"}
