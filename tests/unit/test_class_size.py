"""Classes that fit in a reader's head: no class of the product over 300 lines, no
__init__ over 40. A class's size is its ClassDef's lines, first to last (docstring and
comments included), and its __init__'s likewise. The product is every Python file of the
repository but the tests, the benchmarks and the generated protobuf modules."""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_CLASS = 300
MAX_INIT = 40
NOT_PRODUCT = {"tests", "bench", "build", "dist"}  # top-level folders


def product_files() -> Iterator[Path]:
    """The product's Python files, each once: the walk does not follow the symlinks that
    give the top-level folders their place in the package (fabricprobe/agent -> agent)."""
    for top, dirs, files in os.walk(ROOT):
        here = Path(top)
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".")
            and d != "__pycache__"
            and not d.endswith(".egg-info")
            and not (here == ROOT and d in NOT_PRODUCT)
        )
        for name in sorted(files):
            if name.endswith(".py") and "_pb2" not in name:
                yield here / name


def oversized(path: Path) -> Iterator[str]:
    rel = path.relative_to(ROOT)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.ClassDef):
            continue
        assert node.end_lineno is not None
        size = node.end_lineno - node.lineno + 1
        if size > MAX_CLASS:
            yield f"{rel}:{node.lineno} class {node.name}: {size} lines (at most {MAX_CLASS})"
        for item in node.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == "__init__":
                assert item.end_lineno is not None
                lines = item.end_lineno - item.lineno + 1
                if lines > MAX_INIT:
                    where = f"{rel}:{item.lineno} {node.name}.__init__"
                    yield f"{where}: {lines} lines (at most {MAX_INIT})"


def test_the_walk_finds_the_product_and_nothing_else() -> None:
    files = {p.relative_to(ROOT).as_posix() for p in product_files()}
    assert {"collector/store.py", "probes/responder.py", "fabricprobe/core/settings.py"} <= files
    assert not any(f.startswith(("tests/", "bench/", "fabricprobe/collector/")) for f in files)
    assert not any("_pb2" in f for f in files)


def test_no_class_is_too_large() -> None:
    found = [line for path in product_files() for line in oversized(path)]
    assert not found, "classes to split along their concerns:\n" + "\n".join(found)
