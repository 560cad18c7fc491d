"""`/metrics` bodies from the series store, rendered fast and only when something changed.

Why not just prometheus_client's encoders: they validate and escape every label of every
sample on every scrape (~0.7 ms for the ~130 lines of a run here), under the GIL the
training loop needs. Our label sets are few and stable, so each series' line prefixes are
built once and reused; a scrape only formats numbers (~0.1 ms), and a scrape that finds the
store unchanged since the last one gets the same bytes back without rendering at all.

Only the two formats Prometheus negotiates by default are rendered here: text and
OpenMetrics 1.x, with `underscores` or `allow-utf-8` name escaping (identical for our
names). Any other request (`dots` or `values` escaping, `name[]` filters, OPTIONS, other
methods) is served by prometheus_client's own WSGI app over the same store, and
tests/test_exposition.py checks that our bytes equal prometheus_client's for the same series.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

from rlotel.metrics.store import HistogramPoint, Labels, SeriesStore, Snapshot
from rlotel.schema import catalogue as cat

TEXT, OPENMETRICS = "text", "openmetrics"


def escape_value(value: str) -> str:
    """A label value inside double quotes (both formats escape the same three characters)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def library_family(spec: cat.MetricSpec) -> Metric:
    """prometheus_client's family object for a catalogue spec, still without samples."""
    if spec.kind == "histogram":
        return HistogramMetricFamily(spec.name, spec.help, labels=spec.label_names)
    kind = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
    return kind(spec.name, spec.help, labels=spec.label_names, unit=spec.unit)


def bucket_labels(bounds: Iterable[float]) -> list[str]:
    """The `le` label values of a histogram's upper bounds, `+Inf` last."""
    return [*(repr(float(bound)) for bound in bounds), "+Inf"]


def label_block(names: Iterable[str], values: Iterable[str]) -> str:
    """`{a="1",b="2"}` with names sorted, as prometheus_client writes them."""
    pairs = sorted(zip(names, values, strict=True))
    return "{" + ",".join(f'{name}="{escape_value(value)}"' for name, value in pairs) + "}"


class StoreCollector(Collector):
    """The store as a prometheus_client collector: the oracle the fast renderer is
    checked against, and the server of every request the renderer does not answer."""

    def __init__(self, store: SeriesStore) -> None:
        self._store = store

    def describe(self) -> Iterator[Metric]:
        """Every family the store can expose, so `/metrics?name[]=…` filters find them."""
        return (library_family(spec) for spec in cat.CATALOGUE)

    def collect(self) -> Iterator[Metric]:
        scalars, histograms, _ = self._store.snapshot()
        run = self._store.run
        for spec in cat.CATALOGUE:
            family = library_family(spec)
            if spec.kind == "histogram":
                if spec not in histograms:
                    continue
                for point in histograms[spec]:
                    cumulative = point.counts.cumsum()
                    buckets = [
                        (le, float(count), _library_exemplar(point.exemplars[index]))
                        if index in point.exemplars
                        else (le, float(count))
                        for index, (le, count) in enumerate(
                            zip(bucket_labels(point.bounds), cumulative, strict=True)
                        )
                    ]
                    family.add_metric([run, *point.labels], buckets, point.sum)
                yield family
                continue
            if spec not in scalars:
                continue
            for labels, value in scalars[spec].items():
                family.add_metric([run, *labels], value)
            yield family


def _library_exemplar(exemplar) -> Exemplar:
    return Exemplar(exemplar.labels, exemplar.value, exemplar.timestamp)


class _Family:
    """Header lines and sample names of one catalogue family, in both formats."""

    def __init__(self, spec: cat.MetricSpec) -> None:
        self.spec = spec
        family = library_family(spec)  # its naming rules (unit suffix, `_total`) are ours
        name, unit, kind = family.name, family.unit, family.type
        text_name = f"{name}_total" if kind == "counter" else name
        self.sample_name = text_name
        text_help = spec.help.replace("\\", r"\\").replace("\n", r"\n")  # no quote escaping
        self.headers = {
            TEXT: f"# HELP {text_name} {text_help}\n# TYPE {text_name} {kind}\n",
            OPENMETRICS: f"# HELP {name} {escape_value(spec.help)}\n# TYPE {name} {kind}\n"
            + (f"# UNIT {name} {unit}\n" if unit else ""),
        }


class _HistogramPrefixes:
    """`name_bucket{...,le="0.1"} ` for every bound, then `_count{...} ` and `_sum{...} `."""

    __slots__ = ("buckets", "count", "sum")

    def __init__(
        self,
        spec: cat.MetricSpec,
        names: tuple[str, ...],
        values: tuple[str, ...],
        bounds: tuple[float, ...],
    ):
        self.buckets = [
            f"{spec.name}_bucket{label_block((*names, 'le'), (*values, le))} "
            for le in bucket_labels(bounds)
        ]
        block = label_block(names, values)
        self.count = f"{spec.name}_count{block} "
        self.sum = f"{spec.name}_sum{block} "


class Renderer:
    """Exposition bytes of a store; prefixes kept for the series of the last render only,
    so a family whose label values churn (the bottleneck verdict) cannot grow the cache."""

    def __init__(self, store: SeriesStore) -> None:
        self._store = store
        self._run = store.run
        self._families = [_Family(spec) for spec in cat.CATALOGUE]
        self._prefixes: dict[tuple[cat.MetricSpec, Labels], object] = {}
        self._lock = threading.Lock()
        self._cached: dict[str, tuple[object, bytes, bytes | None]] = {}

    def body(self, form: str, compressed: bool) -> bytes:
        """The current exposition in `form`, gzipped if asked; re-rendered only on change."""
        with self._lock:
            version, body, zipped = self._cached.get(form, (None, b"", None))
            if version != self._store.version:
                snapshot = self._store.snapshot()
                version, body, zipped = snapshot.version, self.render(snapshot, form), None
            if compressed and zipped is None:
                zipped = gzip.compress(body, compresslevel=6)
            self._cached[form] = (version, body, zipped)
            return zipped if compressed else body

    def render(self, snapshot: Snapshot, form: str) -> bytes:
        previous, self._prefixes = self._prefixes, {}
        lines: list[str] = []
        for family in self._families:
            spec = family.spec
            if spec.kind == "histogram":
                points = snapshot.histograms.get(spec)
                if points is None:
                    continue
                lines.append(family.headers[form])
                for point in points:
                    self._histogram_lines(lines, spec, point, previous, form)
                continue
            series = snapshot.scalars.get(spec)
            if series is None:
                continue
            lines.append(family.headers[form])
            for labels, value in series.items():
                key = (spec, labels)
                prefix = previous.get(key) or (
                    family.sample_name + label_block(spec.label_names, (self._run, *labels)) + " "
                )
                self._prefixes[key] = prefix
                lines.append(f"{prefix}{floatToGoString(value)}\n")
        if form == OPENMETRICS:
            lines.append("# EOF\n")
        return "".join(lines).encode()

    def _histogram_lines(
        self,
        lines: list[str],
        spec: cat.MetricSpec,
        point: HistogramPoint,
        previous: dict,
        form: str,
    ) -> None:
        key = (spec, point.labels)
        prefixes = previous.get(key) or _HistogramPrefixes(
            spec, spec.label_names, (self._run, *point.labels), point.bounds
        )
        self._prefixes[key] = prefixes
        cumulative = point.cumulative.tolist()
        exemplars = point.exemplars if form == OPENMETRICS else {}
        for index, (prefix, count) in enumerate(zip(prefixes.buckets, cumulative, strict=True)):
            exemplar = exemplars.get(index)
            if exemplar is None:
                lines.append(f"{prefix}{floatToGoString(count)}\n")
            else:
                labels = label_block(exemplar.labels, exemplar.labels.values())
                lines.append(
                    f"{prefix}{floatToGoString(count)} # {labels} "
                    f"{floatToGoString(exemplar.value)} {exemplar.timestamp}\n"
                )
        lines.append(f"{prefixes.count}{floatToGoString(cumulative[-1])}\n")
        lines.append(f"{prefixes.sum}{floatToGoString(point.sum)}\n")


# Name escapings under which our names (all in the legacy character set) are written as
# they are: Prometheus 2 asks for `underscores` (or nothing), Prometheus 3 `allow-utf-8`.
VERBATIM_ESCAPINGS = ("", "underscores", "allow-utf-8")


def fast_form(accept: str | None) -> tuple[str, str] | None:
    """(form, content type) when this request is one `Renderer` answers, else None."""
    _, content_type = choose_encoder(accept or "")
    escaping = content_type.partition("escaping=")[2]
    if escaping not in VERBATIM_ESCAPINGS:
        return None
    form = OPENMETRICS if content_type.startswith("application/openmetrics-text") else TEXT
    return form, content_type


def wsgi_app(
    renderer: Renderer,
    registry: CollectorRegistry,
    routes: dict[str, Callable[[], tuple[str, bytes]]] | None = None,
) -> Callable:
    """Plain scrapes from the renderer; everything else from prometheus_client's app.
    `routes`: other paths (read per request, so added later they are served too), each
    answering (content type, body) — the driver's `/targets` for HTTP service discovery."""
    fallback = make_wsgi_app(registry)
    routes = {} if routes is None else routes

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        route = routes.get(environ.get("PATH_INFO", "")) if routes else None
        if route is not None:
            content_type, body = route()
            start_response(
                "200 OK", [("Content-Type", content_type), ("Content-Length", str(len(body)))]
            )
            return [body]
        chosen = None
        if (
            environ.get("REQUEST_METHOD") == "GET"
            and not environ.get("QUERY_STRING")
            and environ.get("PATH_INFO") != "/favicon.ico"
        ):
            chosen = fast_form(environ.get("HTTP_ACCEPT"))
        if chosen is None:
            return fallback(environ, start_response)
        form, content_type = chosen
        compressed = gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING") or "")
        body = renderer.body(form, compressed)
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        if compressed:
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [body]

    return app
