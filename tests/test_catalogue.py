"""The catalogue is the one list of rlotel's metric families: each defined family is in it,
and the README's metric list names every one of them."""

from __future__ import annotations

import re
from pathlib import Path

from rlotel import catalogue as cat

README = Path(__file__).resolve().parents[1] / "README.md"


def test_every_defined_family_is_catalogued_once() -> None:
    defined = [value for value in vars(cat).values() if isinstance(value, cat.MetricSpec)]
    assert list(cat.CATALOGUE) == defined
    names = [spec.name for spec in cat.CATALOGUE]
    assert len(names) == len(set(names))
    assert all(name.startswith(cat.PREFIX) for name in names)


def test_the_readme_lists_every_family_and_nothing_else() -> None:
    section = README.read_text().split("## Metrics", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`(rlotel_[a-z_]+)", section))
    exposed = {
        spec.sample_names[0] if spec.kind == "counter" else spec.name for spec in cat.CATALOGUE
    }
    assert listed == exposed, (sorted(exposed - listed), sorted(listed - exposed))
