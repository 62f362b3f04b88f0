"""The package's floors: every module imports only from its own floor or those below, the
agent and the collector never import each other, no two modules import each other, and
nothing in probes/ outside probes/rdma/ imports probes/rdma/ (the TCP probe runs on a
host without libibverbs).

    0  fabricprobe              (the version)
    1  fabricprobe.core         (the ground floor: deadlines, host:port, errors, sketches and
                                 their codec, the API, settings, logging)
    2  fabricprobe.probes       (measurement)
    3  fabricprobe.agent | fabricprobe.collector | fabricprobe.workload   (apart)
    4  fabricprobe.grafana
    5  fabricprobe.cli          (the `probe` command)
    6  fabricprobe.__main__     (`python -m fabricprobe`)

Imports inside functions count as much as those at the top of a module.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fabricprobe"
FLOORS = {
    "fabricprobe": 0,
    "fabricprobe.core": 1,
    "fabricprobe.probes": 2,
    "fabricprobe.agent": 3,
    "fabricprobe.collector": 3,
    "fabricprobe.workload": 3,
    "fabricprobe.grafana": 4,
    "fabricprobe.report": 4,
    "fabricprobe.cli": 5,
    "fabricprobe.__main__": 6,
}
BARE = {"agent", "collector", "probes", "grafana"}


def modules() -> dict[str, Path]:
    """Every module of the package, found through the symlinked top-level folders."""
    found: dict[str, Path] = {}
    paths = [
        Path(top, f)
        for top, _, files in os.walk(PACKAGE, followlinks=True)  # rglob skips symlinks
        for f in files
        if f.endswith(".py")
    ]
    for path in sorted(paths):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def unit_of(name: str) -> str:
    """The FLOORS key a module falls under (the longest matching prefix)."""
    best = ""
    for key in FLOORS:
        if (name == key or name.startswith(key + ".")) and len(key) > len(best):
            best = key
    return best


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that NAME imports (a `from X import Y` of a submodule is Y)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] in BARE:
                out.add(target)  # caught below: the old top-level names
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def test_every_module_has_a_floor() -> None:
    orphans = [name for name in modules() if not unit_of(name)]
    assert not orphans, f"modules outside every floor: {orphans}"


def test_nothing_imports_upward_or_sideways() -> None:
    bad = []
    for name, targets in graph().items():
        mine = unit_of(name)
        for target in targets:
            theirs = unit_of(target)
            if not theirs:
                bad.append(f"{name} -> {target} (not under fabricprobe)")
            elif FLOORS[theirs] > FLOORS[mine]:
                bad.append(f"{name} -> {target} (floor {FLOORS[theirs]} above {FLOORS[mine]})")
            elif FLOORS[theirs] == FLOORS[mine] and theirs != mine:
                bad.append(f"{name} -> {target} ({mine} and {theirs} stay apart)")
    assert not bad, "\n".join(bad)


def test_only_rdma_probes_import_rdma() -> None:
    rdma = "fabricprobe.probes.rdma"
    bad = [
        f"{name} -> {target}"
        for name, targets in graph().items()
        if unit_of(name) == "fabricprobe.probes" and not _under(name, rdma)
        for target in targets
        if _under(target, rdma)
    ]
    assert not bad, "\n".join(bad)


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_no_two_modules_import_each_other() -> None:
    g = graph()
    pairs = sorted({tuple(sorted((a, b))) for a, bs in g.items() for b in bs if a in g.get(b, ())})
    assert not pairs, f"modules importing each other: {pairs}"


def _repository_sources() -> list[Path]:
    """The repository's Python files outside the package, its environments and caches
    left unwalked (a venv alone holds tens of thousands of files)."""
    skip = {".venv", ".git", "node_modules", "test-results", "__pycache__"}
    found = []
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in skip and not d.endswith("_cache")]
        here = Path(top)
        if here == PACKAGE or PACKAGE in here.parents:
            dirs[:] = []
            continue
        found += [here / f for f in files if f.endswith(".py")]
    return sorted(found)


def test_nothing_in_the_repository_imports_the_old_top_level_names() -> None:
    bad = []
    for path in _repository_sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            bad += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in BARE]
    assert not bad, bad
