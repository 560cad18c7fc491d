"""`/metrics` bodies: what Prometheus parses back is what the store holds.

hypothesis builds stores with awkward label values (quotes, backslashes, newlines, unicode),
extreme and non-finite numbers, exemplars and configured bucket bounds; the text and the
OpenMetrics body must both parse (prometheus_client's parsers) into the store's series,
each with its `run` label, and OpenMetrics must carry the exemplars. Over HTTP, the
formats, name escapings and compression Prometheus asks for are the ones served.
"""

from __future__ import annotations

import gzip
import math
import urllib.error
import urllib.request

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client import parser as text_parser
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.openmetrics import parser as openmetrics_parser
from prometheus_client.samples import Exemplar

from rlotel.base.drops import Drops
from rlotel.schema import catalogue as cat
from rlotel.series.store import SeriesStore
from rlotel.sinks.metrics import exposition

# What Prometheus 2.x and 3.x send when scraping (OpenMetrics, gzip-compressed).
PROMETHEUS_2_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
PROMETHEUS_3_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,"
    "*/*;q=0.1"
)
SCALAR_SPECS = [spec for spec in cat.CATALOGUE if spec.kind != "histogram"]
HISTOGRAM_SPECS = [spec for spec in cat.CATALOGUE if spec.kind == "histogram"]

label_values = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=12
) | st.sampled_from(['a"b', "back\\slash", "new\nline", "ünï", "le", "+Inf"])
numbers = st.floats(width=64) | st.sampled_from([0.0, -0.0, 1e-300, 123456789.0, 1e22, 0.1])
positive = st.floats(min_value=0.0, max_value=1e7, allow_nan=False)


def hex_ids(width: int) -> st.SearchStrategy[str]:
    """Trace and span ids as exemplars carry them."""
    return st.integers(0, 16**width - 1).map(lambda n: f"{n:0{width}x}")


@st.composite
def stores(draw) -> SeriesStore:
    run = draw(label_values)
    drops = Drops()
    bounds = st.lists(positive, min_size=1, max_size=8, unique=True).map(sorted).map(tuple)
    buckets = draw(st.dictionaries(st.sampled_from([s.name for s in HISTOGRAM_SPECS]), bounds))
    store = SeriesStore(run, drops, max_series=50, buckets=buckets)
    for _ in range(draw(st.integers(0, 12))):
        spec = draw(st.sampled_from(SCALAR_SPECS))
        labels = draw(st.tuples(*(label_values for _ in spec.labels)))
        value = draw(numbers)
        if spec.kind == "counter" and spec is not cat.DROPPED:
            store.inc(spec, abs(value) if math.isfinite(value) else 1.0, *labels)
        elif spec is not cat.DROPPED:
            store.set(spec, value, *labels)
    for _ in range(draw(st.integers(0, 4))):
        spec = draw(st.sampled_from(HISTOGRAM_SPECS))
        labels = draw(st.tuples(*(label_values for _ in spec.labels)))
        values = np.array(draw(st.lists(positive, max_size=40)), dtype=np.float64)
        exemplars = [
            Exemplar(
                {"trace_id": draw(hex_ids(32)), "span_id": draw(hex_ids(16))},
                draw(positive),
                draw(st.floats(min_value=1e9, max_value=2e9)),  # Unix seconds
            )
            for _ in range(draw(st.integers(0, 3)))
        ]
        store.observe(spec, values, *labels, exemplars=exemplars)
    for _ in range(draw(st.integers(0, 2))):
        drops.add(draw(st.sampled_from(["spans", "metrics"])), draw(label_values), "fuzz")
    return store


def expected(store: SeriesStore) -> tuple[dict, dict]:
    """The store's samples by (name, labels) with `le` as a float, and its exemplars by
    bucket sample: what a scrape must parse back into."""
    snapshot = store.snapshot()
    samples: dict = {}
    exemplars: dict = {}
    for spec, series in snapshot.scalars.items():
        for labels, value in series.items():
            names = zip(spec.label_names, (store.run, *labels), strict=True)
            samples[(spec.sample_names[0], frozenset(names))] = value
    for spec, points in snapshot.histograms.items():
        for point in points:
            labels = frozenset(zip(spec.label_names, (store.run, *point.labels), strict=True))
            for index, le in enumerate((*point.bounds, math.inf)):
                key = (f"{spec.name}_bucket", labels | {("le", float(le))})
                samples[key] = float(point.cumulative[index])
                if index in point.exemplars:
                    exemplars[key] = point.exemplars[index]
            samples[(f"{spec.name}_count", labels)] = float(point.cumulative[-1])
            samples[(f"{spec.name}_sum", labels)] = point.sum
    return samples, exemplars


def parsed(families) -> tuple[dict, dict]:
    """Samples and exemplars of parsed families, keyed as `expected` keys them."""
    samples: dict = {}
    exemplars: dict = {}
    for family in families:
        for sample in family.samples:
            labels = {k: float(v) if k == "le" else v for k, v in sample.labels.items()}
            key = (sample.name, frozenset(labels.items()))
            samples[key] = sample.value
            if sample.exemplar is not None:
                exemplars[key] = sample.exemplar
    return samples, exemplars


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@settings(max_examples=150, deadline=None)
@given(stores())
def test_what_prometheus_parses_is_the_store(store: SeriesStore) -> None:
    want, want_exemplars = expected(store)
    registry = exposition.registry(store)
    text = generate_latest(registry).decode()
    om = openmetrics.generate_latest(registry).decode()
    for body, parse in ((text, text_parser), (om, openmetrics_parser)):
        got, got_exemplars = parsed(parse.text_string_to_metric_families(body))
        assert got.keys() == want.keys()
        assert all(same(got[key], value) for key, value in want.items())
    assert parsed(text_parser.text_string_to_metric_families(text))[1] == {}
    assert got_exemplars.keys() == want_exemplars.keys()  # OpenMetrics carries exemplars
    for key, exemplar in want_exemplars.items():
        assert got_exemplars[key].labels == exemplar.labels
        assert got_exemplars[key].value == exemplar.value
        assert float(got_exemplars[key].timestamp) == pytest.approx(exemplar.timestamp, abs=1e-3)


def fetch(url: str, method: str = "GET", **headers: str) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


@pytest.fixture
def served(make_tel):
    """A run with steps, samples, a logged dict and a drop, flushed and quiescent."""
    tel = make_tel(run='quo"ted')
    rng = np.random.default_rng(3)
    for number in range(3):
        with tel.step(number) as step:
            with tel.phase("gen"):
                tel.record_samples(generate_sequences=rng.lognormal(size=16))
            step.set_tokens(prompt=[3] * 16, response=[9] * 16)
        tel.log({"actor/pg_loss": float(number), "bad": float("nan")}, step=number)
    assert tel.flush(10)
    return tel


def steps_total(samples: dict) -> float:
    return samples[("rlotel_steps_total", frozenset({("run", 'quo"ted')}))]


@pytest.mark.parametrize(
    ("accept", "escaping"),
    [(PROMETHEUS_2_ACCEPT, "underscores"), (PROMETHEUS_3_ACCEPT, "allow-utf-8")],
)
def test_prometheus_scrape_request_gets_openmetrics_gzip(served, accept, escaping) -> None:
    status, headers, body = fetch(served.metrics_url, Accept=accept, **{"Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    assert headers["Content-Type"] == (
        f"application/openmetrics-text; version=1.0.0; charset=utf-8; escaping={escaping}"
    )
    text = gzip.decompress(body)
    assert int(headers["Content-Length"]) == len(body)
    samples, exemplars = parsed(openmetrics_parser.text_string_to_metric_families(text.decode()))
    assert steps_total(samples) == 3.0
    assert exemplars and b" # {span_id=" in text  # exemplars are in the OpenMetrics body


def test_plain_scrape_gets_text_004(served) -> None:
    status, headers, body = fetch(served.metrics_url)
    assert status == 200 and "Content-Encoding" not in headers
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    samples, exemplars = parsed(text_parser.text_string_to_metric_families(body.decode()))
    assert steps_total(samples) == 3.0 and not exemplars and b"# {" not in body


def test_other_name_escapings_filters_and_methods(served) -> None:
    url = served.metrics_url
    values = "application/openmetrics-text; version=1.0.0; escaping=values"
    status, headers, body = fetch(url, Accept=values)
    assert status == 200 and headers["Content-Type"].endswith("escaping=values")
    assert b"U__rlotel__step__time__seconds" in body
    dotted = "text/plain; version=1.0.0; escaping=dots"
    status, headers, body = fetch(url, Accept=dotted)
    assert status == 200 and b"rlotel__step__time__seconds" in body
    status, _, body = fetch(url + "?name[]=rlotel_steps_total")
    families = {line.split()[2] for line in body.decode().splitlines() if line.startswith("#")}
    assert status == 200 and families == {"rlotel_steps_total"}
    status, headers, _ = fetch(url, method="OPTIONS")
    assert status == 200 and headers["Allow"] == "OPTIONS,GET"
    status, _, _ = fetch(url, method="POST")
    assert status == 405


def _tokens(tel) -> dict[str, float]:
    _, _, body = fetch(tel.metrics_url)
    samples, _ = parsed(text_parser.text_string_to_metric_families(body.decode()))
    return {
        dict(labels)["kind"]: value
        for (name, labels), value in samples.items()
        if name == "rlotel_tokens_total"
    }


def test_token_kinds_sum_to_verls_total_with_no_aggregate_beside_them(served, make_tel) -> None:
    """Each token is counted under one kind, so `sum without (kind)` is the total: the
    parts when the batch is seen, `unsplit` when only verl's logged total is known."""
    assert _tokens(served) == {"prompt": 3 * 3 * 16.0, "response": 3 * 9 * 16.0}
    logged = make_tel(run="logged")
    for number in (1, 2):
        logged.log({"perf/total_num_tokens": 100.0 * number}, step=number)
    assert logged.flush(10)
    assert _tokens(logged) == {cat.TOKENS_UNSPLIT: 300.0}
    # verl logging its total for a step the ledger split (V1 logs it as a step of its own
    # number): the parts stand, the total is not added beside them
    split = make_tel(run="split")
    with split.step(1) as step:
        step.set_tokens(prompt=[3, 3], response=[9, 9])
    split.log({"perf/total_num_tokens": 24.0}, step=7)
    assert split.flush(10)
    assert _tokens(split) == {"prompt": 6.0, "response": 18.0}
