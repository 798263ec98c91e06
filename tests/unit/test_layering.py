"""The coordinator's modules import one another without a circle (issue 20): each part can be
read, tested and replaced from the bottom up. Imports inside functions count too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "coordinator"


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports() -> dict[str, set[str]]:
    mods = {_module(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps: set[str] = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name and not name.startswith(t + "."):  # a package's own __init__ is not a cycle
                    deps.add(t)
        graph[name] = deps
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str]:
        state[n] = 1
        stack.append(n)
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return []

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return []


def test_the_coordinator_has_no_import_circle() -> None:
    graph = _imports()
    assert "chorus.coordinator" in graph and "chorus.commit.pipeline" in graph["chorus.coordinator"]
    assert _cycle(graph) == []


def test_the_finder_sees_a_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(graph.get(n, ()))
    return seen


def test_the_daemon_never_imports_test_or_lab_tooling() -> None:
    """``chorus run`` (cli/node.py's daemon, coordinator.py and all they import) stands without
    chorus.testkit: the checkers, workloads, local cluster and lab exist for tests and labs."""
    graph = _imports()
    daemon = _reach(graph, "chorus.coordinator")
    assert "chorus.replicator" in daemon and "chorus.wslog.writer" in daemon
    assert sorted(m for m in daemon if _in(m, "chorus.testkit")) == []
    # only the command line (chorus local, lab, check, demo, migrate) and the tooling itself use it
    users = {m for m, deps in graph.items() if any(_in(d, "chorus.testkit") for d in deps)}
    assert {m for m in users if not any(_in(m, p) for p in ("chorus.testkit", "chorus.cli", "chorus.migrate"))} == set()


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_parts_that_carry_out_actions_take_values_not_the_replicator() -> None:
    """The replicator's decisions are values (chorus.actions); the commit path, voting and causal
    reads use them without the state machine that makes them."""
    graph = _imports()
    for part in ("chorus.commit.pipeline", "chorus.commit.backends", "chorus.voting", "chorus.commit.causal"):
        assert "chorus.replicator" not in _reach(graph, part), part


def test_membership_is_a_part_below_the_replicator() -> None:
    """Membership and the join handshake (chorus.membership) are a part of their own, which the
    replicator asks: it knows neither that state machine nor certification nor the commit path."""
    graph = _imports()
    assert "chorus.membership" in graph["chorus.replicator"]
    reach = _reach(graph, "chorus.membership")
    for part in ("chorus.replicator", "chorus.certifier", "chorus.commit", "chorus.coordinator"):
        assert not any(_in(m, part) for m in reach), part
