"""The catalogue is the one list of rlotel's metric families: each defined family is in it,
and the metrics page (generated from it by docs/build.py) names every one of them."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from rlotel.schema import catalogue as cat

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _docs_build():
    spec = importlib.util.spec_from_file_location("docs_build", DOCS / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_defined_family_is_catalogued_once() -> None:
    defined = [value for value in vars(cat).values() if isinstance(value, cat.MetricSpec)]
    assert list(cat.CATALOGUE) == defined
    names = [spec.name for spec in cat.CATALOGUE]
    assert len(names) == len(set(names))
    assert all(name.startswith(cat.PREFIX) for name in names)


def test_the_metrics_page_is_generated_from_the_catalogue_and_lists_every_family() -> None:
    page = (DOCS / "metrics.md").read_text()
    assert page == _docs_build().metrics_page(), "docs/metrics.md drifted: python docs/build.py"
    listed = set(re.findall(r"^\| `(rlotel_[a-z_]+)`", page, re.MULTILINE))
    exposed = {
        spec.sample_names[0] if spec.kind == "counter" else spec.name for spec in cat.CATALOGUE
    }
    assert listed == exposed, (sorted(exposed - listed), sorted(listed - exposed))
