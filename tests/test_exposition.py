"""`/metrics` bodies: byte-identical to prometheus_client's, re-rendered only on change.

prometheus_client's encoders over the same store are the oracle: hypothesis builds stores
with awkward label values (quotes, backslashes, newlines, unicode), extreme numbers,
exemplars and configured bucket bounds, and both formats must match byte for byte. Over
HTTP, the requests Prometheus makes are answered by the fast path and the rest by
prometheus_client's own app.
"""

from __future__ import annotations

import gzip
import urllib.error
import urllib.request

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.samples import Exemplar

from rlotel.metrics.store import SeriesStore
from rlotel.record.drops import Drops
from rlotel.schema import catalogue as cat
from rlotel.sinks.metrics.exposition import OPENMETRICS, TEXT, Renderer, StoreCollector

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
numbers = st.floats(allow_nan=False, allow_infinity=False, width=64) | st.sampled_from(
    [0.0, -0.0, 1e-300, 123456789.0, 1e22, 0.1]
)
positive = st.floats(min_value=0.0, max_value=1e7, allow_nan=False)


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
            store.inc(spec, abs(value), *labels)
        elif spec is not cat.DROPPED:
            store.set(spec, value, *labels)
    for _ in range(draw(st.integers(0, 4))):
        spec = draw(st.sampled_from(HISTOGRAM_SPECS))
        labels = draw(st.tuples(*(label_values for _ in spec.labels)))
        values = np.array(draw(st.lists(positive, max_size=40)), dtype=np.float64)
        exemplars = [
            Exemplar(
                {"trace_id": draw(label_values), "span_id": draw(label_values)},
                draw(positive),
                draw(st.floats(min_value=0, max_value=2e9)),
            )
            for _ in range(draw(st.integers(0, 3)))
        ]
        store.observe(spec, values, *labels, exemplars=exemplars)
    for _ in range(draw(st.integers(0, 2))):
        drops.add(draw(st.sampled_from(["spans", "metrics"])), draw(label_values), "fuzz")
    return store


def library_bodies(store: SeriesStore, escaping: str = openmetrics.UNDERSCORES) -> dict:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))
    return {
        TEXT: generate_latest(registry, escaping=escaping),
        OPENMETRICS: openmetrics.generate_latest(registry, escaping=escaping),
    }


@settings(max_examples=150, deadline=None)
@given(stores())
def test_bodies_equal_prometheus_clients(store: SeriesStore) -> None:
    renderer = Renderer(store)
    snapshot = store.snapshot()
    for escaping in (openmetrics.UNDERSCORES, openmetrics.ALLOWUTF8):  # Prometheus 2, 3
        expected = library_bodies(store, escaping)
        for form in (TEXT, OPENMETRICS):
            assert renderer.render(snapshot, form) == expected[form]
            assert renderer.render(snapshot, form) == expected[form]  # cached prefixes


def filled_store(run: str = "r") -> tuple[SeriesStore, Drops]:
    drops = Drops()
    store = SeriesStore(run, drops, max_series=50)
    store.set(cat.STEP_TIME, 1.5)
    store.inc(cat.TOKENS, 10.0, "total")
    store.observe(cat.AGENT_LOOP_DURATION, np.array([0.1, 2.0]), "generate_sequences")
    return store, drops


def test_unchanged_store_is_not_rendered_again() -> None:
    store, drops = filled_store()
    renderer = Renderer(store)
    first = renderer.body(TEXT, compressed=False)
    assert renderer.body(TEXT, compressed=False) is first  # same object: no render
    zipped = renderer.body(TEXT, compressed=True)
    assert gzip.decompress(zipped) == first
    assert renderer.body(TEXT, compressed=True) is zipped
    store.set(cat.STEP_TIME, 2.5)
    second = renderer.body(TEXT, compressed=False)
    assert second is not first and b"rlotel_step_time_seconds" in second
    assert second == library_bodies(store)[TEXT]
    drops.add("metrics", "non_finite", "x=nan")  # a drop changes the body too
    third = renderer.body(TEXT, compressed=False)
    assert b'reason="non_finite"' in third and third == library_bodies(store)[TEXT]
    assert gzip.decompress(renderer.body(TEXT, compressed=True)) == third
    assert renderer.body(OPENMETRICS, compressed=False).endswith(b"# EOF\n")


def test_prefix_cache_follows_the_live_series_only() -> None:
    """The verdict family replaces its one series each step; old prefixes must not pile up."""
    store, _ = filled_store()
    renderer = Renderer(store)
    for number in range(500):
        store.replace(cat.BOTTLENECK, 1.0, "phase", f"update_actor {number}")
        body = renderer.body(TEXT, compressed=False)
    assert b"update_actor 499" in body and b"update_actor 498" not in body
    assert len(renderer._prefixes) == 4  # step time, tokens, one histogram, the verdict


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
    return tel, tel._endpoint.registry


@pytest.mark.parametrize(
    ("accept", "escaping"),
    [(PROMETHEUS_2_ACCEPT, "underscores"), (PROMETHEUS_3_ACCEPT, "allow-utf-8")],
)
def test_prometheus_scrape_request_gets_openmetrics_gzip(served, accept, escaping) -> None:
    tel, registry = served
    status, headers, body = fetch(tel.metrics_url, Accept=accept, **{"Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    assert headers["Content-Type"] == (
        f"application/openmetrics-text; version=1.0.0; charset=utf-8; escaping={escaping}"
    )
    text = gzip.decompress(body)
    assert int(headers["Content-Length"]) == len(body)
    assert text == openmetrics.generate_latest(registry, escaping=escaping)
    assert b" # {span_id=" in text  # exemplars are in the OpenMetrics body


def test_plain_scrape_gets_text_004(served) -> None:
    tel, registry = served
    status, headers, body = fetch(tel.metrics_url)
    assert status == 200 and "Content-Encoding" not in headers
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert body == generate_latest(registry) and b"# {" not in body


def test_other_requests_are_served_by_prometheus_client(served) -> None:
    tel, registry = served
    values = "application/openmetrics-text; version=1.0.0; escaping=values"
    status, headers, body = fetch(tel.metrics_url, Accept=values)
    assert status == 200 and headers["Content-Type"].endswith("escaping=values")
    assert body == openmetrics.generate_latest(registry, escaping=openmetrics.VALUES)
    assert b"U__rlotel__step__time__seconds" in body
    dotted = "text/plain; version=1.0.0; escaping=dots"
    status, headers, body = fetch(tel.metrics_url, Accept=dotted)
    assert status == 200 and b"rlotel__step__time__seconds" in body
    status, _, body = fetch(tel.metrics_url + "?name[]=rlotel_steps_total")
    families = {line.split()[2] for line in body.decode().splitlines() if line.startswith("#")}
    assert status == 200 and families == {"rlotel_steps_total"}
    status, headers, _ = fetch(tel.metrics_url, method="OPTIONS")
    assert status == 200 and headers["Allow"] == "OPTIONS,GET"
    status, _, _ = fetch(tel.metrics_url, method="POST")
    assert status == 405
