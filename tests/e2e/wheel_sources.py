"""The real runs use the engine venv's rlotel, the wheel of this tree: a wheel built before
an edit would test old code and pass. So `make engine-venv` records, with the wheel it
installs, the digest of each of the wheel's sources (this script); before the real runs,
tests/e2e/conftest.py compares the record with the tree and refuses a stale wheel.

The wheel's sources: pyproject.toml, setup.py, README.md, rlotel/ (but bytecode caches) and
the stack setup.py maps in (`rlotel.offline.stack.stack_files`, loaded by path). The
Makefile rebuilds the wheel when one of them changes (`--list`). Standard library only: the
Makefile runs it with the system python3.

    python3 tests/e2e/wheel_sources.py          # the record: "<sha256>  <path>" lines
    python3 tests/e2e/wheel_sources.py --list   # the paths, for the Makefile
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / ".venv-engine" / ".rlotel-wheel.sha256"  # written by `make engine-venv`
METADATA = ("pyproject.toml", "setup.py", "README.md")


def sources(root: Path) -> list[str]:
    """The wheel's source files under `root`, as sorted relative paths."""
    spec = importlib.util.spec_from_file_location(
        "_rlotel_stack", root / "rlotel" / "offline" / "stack" / "__init__.py"
    )
    assert spec is not None and spec.loader is not None
    stack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stack)
    package = (
        path.relative_to(root).as_posix()
        for path in (root / "rlotel").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    )
    return sorted({*METADATA, *package, *stack.stack_files(root)})


def digests(root: Path) -> dict[str, str]:
    """Each source's sha256 by its path."""
    return {name: hashlib.sha256((root / name).read_bytes()).hexdigest() for name in sources(root)}


def render(record: dict[str, str]) -> str:
    return "".join(f"{digest}  {name}\n" for name, digest in record.items())


def parse(text: str) -> dict[str, str]:
    return dict(reversed(line.split("  ", 1)) for line in text.splitlines() if line)


def stale(root: Path, record: Path) -> str | None:
    """Why the wheel recorded in `record` is not the wheel of `root`'s sources, or None."""
    if not record.exists():
        return f"no record of the engine venv's rlotel wheel ({record}): run `make engine-venv`"
    built, now = parse(record.read_text()), digests(root)
    changed = sorted(name for name in built.keys() | now.keys() if built.get(name) != now.get(name))
    if not changed:
        return None
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    return (
        f"the engine venv's rlotel wheel is older than the tree ({', '.join(changed[:3])}{more} "
        "changed since it was built): run `make engine-venv`"
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["--list"]:
        print(" ".join(sources(ROOT)))
    else:
        sys.stdout.write(render(digests(ROOT)))
