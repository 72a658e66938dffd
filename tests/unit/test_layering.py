"""The package's layering, read from the source (no imports executed):

- pure policy (lifecycle -> forecast -> allocation -> planning, the workload generator, the simulator) imports
  neither SGLang, torch nor HTTP or IPC libraries, directly or through another module of ours;
- no import cycles between our modules (module-level imports; a function-level import is how a tool module reaches a
  heavy dependency lazily and cannot form a load-time cycle).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "sglang_prorsa"

PURE = ("sglang_prorsa.srt.lifecycle", "sglang_prorsa.srt.forecast", "sglang_prorsa.srt.role_switch",
        "sglang_prorsa.workload", "sglang_prorsa.sim", "sglang_prorsa.srt.utils.clock")
# Tools that live beside the simulator but talk to a live server or draw pictures on purpose.
PURE_EXEMPT = ("sglang_prorsa.sim.fit", "sglang_prorsa.sim.plots", "sglang_prorsa.sim.__main__")
FORBIDDEN = ("sglang", "torch", "triton", "fastapi", "starlette", "aiohttp", "requests", "httpx", "uvicorn", "zmq",
             "urllib.request", "http.client", "mooncake")


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, module_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    out: set[str] = set()
    for node in nodes:
        if module_level_only and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
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


def test_no_import_cycles():
    modules = all_modules()
    # `from pkg import sibling` inside pkg re-enters pkg's __init__, which Python allows (it is already loading):
    # an edge from a module to one of its own enclosing packages is not a cycle.
    graph = {m: {t for i in imports(p, module_level_only=True) if i.startswith("sglang_prorsa")
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
