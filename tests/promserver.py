"""A real Prometheus (Debian package) on loopback, started and stopped by the test."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Prometheus:
    def __init__(
        self,
        workdir: Path,
        targets: list[str],
        features: tuple[str, ...] = (),
        config: dict | None = None,
        config_file: Path | None = None,  # a config file as it is (else one written here)
    ) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus is not installed: run `make test` (it installs it)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config_path = config_file or workdir / "prometheus.yml"
        if config_file is None:
            config_path.write_text(
                json.dumps(  # JSON is YAML
                    config
                    or {
                        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                        "scrape_configs": [
                            {"job_name": "rlotel", "static_configs": [{"targets": targets}]}
                        ],
                    }
                )
            )
        command = [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        if features:
            command.append(f"--enable-feature={','.join(features)}")
        self._log = (workdir / "prometheus.log").open("w")
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"prometheus exited with {self.process.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        pytest.fail("prometheus did not become ready in 30 s")

    def api(self, path: str, **params: str) -> dict:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=5) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> list[dict]:
        return self.api("query", query=promql)["result"]

    def scalar(self, promql: str) -> float | None:
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else None

    def wait_for(self, promql: str, expected: float, timeout_s: float = 20.0) -> None:
        """Poll (bounded) until the query's single value equals `expected`."""
        deadline = time.monotonic() + timeout_s
        value = None
        while time.monotonic() < deadline:
            value = self.scalar(promql)
            if value == expected:
                return
            time.sleep(0.2)
        pytest.fail(f"{promql} = {value}, expected {expected} within {timeout_s}s")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        self._log.close()
