"""Secure by default: TLS and basic auth on /metrics, no secrets or text in any signal."""

from __future__ import annotations

import logging
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

import rlotel
from tests.otlp_receiver import FaultyReceiver
from tests.promserver import Prometheus

SECRET_TEXT = "The patient's name is Ada Lovelace and her card number is 4111"
TOKEN = "s3cr3t-token-do-not-log"


@pytest.fixture
def certificate(tmp_path):
    if shutil.which("openssl") is None:
        pytest.fail("openssl is not installed: `make system-deps` installs Debian's")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def fetch(url: str, cafile, credentials: tuple[str, str] | None = None) -> int:
    context = ssl.create_default_context(cafile=str(cafile))
    request = urllib.request.Request(url)
    if credentials:
        import base64

        token = base64.b64encode(":".join(credentials).encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.slow
def test_tls_and_basic_auth_scraped_by_prometheus(make_tel, certificate, tmp_path):
    cert, key = certificate
    tel = make_tel(
        run="secure", prometheus_tls=(cert, key), prometheus_basic_auth=("scraper", "pa55")
    )
    assert tel.metrics_url.startswith("https://127.0.0.1:")
    with tel.step(1), tel.phase("gen"):
        pass
    tel.flush(10)
    assert fetch(tel.metrics_url, cert) == 401
    assert fetch(tel.metrics_url, cert, ("scraper", "wrong")) == 401
    assert fetch(tel.metrics_url, cert, ("scraper", "pa55")) == 200
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP is not served
        urllib.request.urlopen(tel.metrics_url.replace("https", "http"), timeout=5)
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "rlotel",
                "scheme": "https",
                "tls_config": {"ca_file": str(cert)},
                "basic_auth": {"username": "scraper", "password": "pa55"},
                "static_configs": [{"targets": [urllib.parse.urlsplit(tel.metrics_url).netloc]}],
            }
        ],
    }
    prometheus = Prometheus(tmp_path, [], config=config)
    try:
        prometheus.wait_for('rlotel_steps_total{run="secure"}', 1)
    finally:
        prometheus.stop()


@pytest.mark.slow
def test_no_token_and_no_text_leaves_the_process(tmp_path, monkeypatch, caplog, capfd):
    """Tokens in OTLP headers and text passed by mistake appear in no log, file or series."""
    caplog.set_level(logging.DEBUG)
    receiver = FaultyReceiver("unavailable")  # failures make exporters log
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"authorization=Bearer {TOKEN}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    traces = tmp_path / "traces.jsonl"
    tel = rlotel.init(run="private", prometheus_port=0, traces_file=traces)
    try:
        with tel.step(1) as step:
            with tel.phase("gen"):
                tel.record_samples(generate_sequences=[0.5, SECRET_TEXT], prompt_length=[3, 4])
            step.set_tokens(prompt=[SECRET_TEXT, 3], response=[5, 6])
            step.set_mfu(actor=SECRET_TEXT)
        tel.log({"sample/prompt": SECRET_TEXT, "actor/loss": 0.5}, step=1)
        tel.flush(5)
        exposition = urllib.request.urlopen(tel.metrics_url, timeout=5).read().decode()
        time.sleep(0)  # nothing to wait for: flush above was bounded
    finally:
        tel.shutdown(3)
        receiver.stop()
    captured = capfd.readouterr()
    signals = {
        "logs": "\n".join(record.getMessage() for record in caplog.records),
        "stderr": captured.err + captured.out,
        "traces file": traces.read_text(),
        "metrics": exposition,
    }
    for where, text in signals.items():
        assert TOKEN not in text, f"the OTLP token leaked into {where}"
        assert "Ada Lovelace" not in text, f"text leaked into {where}"
    assert "actor/loss" in exposition  # valid data still went through
