"""What a zero-code integration replaced in another library, to put back: one registry."""

from __future__ import annotations

from typing import Any


class Patches:
    """(owner, attribute) → the original; `undo` restores them, newest first."""

    def __init__(self) -> None:
        self._originals: dict[tuple[int, str], tuple[Any, str, Any]] = {}

    def replace(self, owner: Any, name: str, replacement: Any) -> Any:
        """Set `owner.name` to `replacement`; returns what was there."""
        original = getattr(owner, name)
        self._originals.setdefault((id(owner), name), (owner, name, original))
        setattr(owner, name, replacement)
        return original

    def original(self, owner: Any, name: str) -> Any:
        """What `owner.name` was before this registry replaced it (else what it is)."""
        entry = self._originals.get((id(owner), name))
        return entry[2] if entry is not None else getattr(owner, name)

    def __bool__(self) -> bool:
        return bool(self._originals)

    def undo(self) -> None:
        for owner, name, original in reversed(list(self._originals.values())):
            setattr(owner, name, original)
        self._originals.clear()
