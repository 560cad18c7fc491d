"""The one build step pyproject.toml cannot declare: the wheel carries the observability
stack inside the package. Its one source is the repository's top-level collector/ and
dashboards/*.json; the build maps them to rlotel/offline/stack/, where `rlotel stack DIR`
reads them, and the sdist carries them (the wheel is built from it). Which files ship is
`rlotel.offline.stack.stack_files`, loaded by path: the build has none of rlotel's
dependencies."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PACKAGE_DIR = Path("rlotel", "offline", "stack")


def _stack_sources() -> dict[Path, Path]:
    """Each stack file's place in the package → its source in the tree."""
    spec = importlib.util.spec_from_file_location("_rlotel_stack", PACKAGE_DIR / "__init__.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {PACKAGE_DIR / name: Path(name) for name in module.stack_files(Path("."))}


STACK = _stack_sources()


class BuildPyWithStack(build_py):
    """build_py plus the stack files; an editable install reads them in the checkout."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        for target, source in STACK.items():
            out = Path(self.build_lib, target)
            self.mkpath(str(out.parent))
            self.copy_file(str(source), str(out))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        if self.editable_mode:
            return outputs
        return [*outputs, *(str(Path(self.build_lib, target)) for target in STACK)]

    def get_source_files(self) -> list[str]:
        return [*super().get_source_files(), *(str(source) for source in STACK.values())]


setup(cmdclass={"build_py": BuildPyWithStack})
