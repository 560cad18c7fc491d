"""Config fields of the Collector components the two-tier configs use, as contrib 0.144.0
accepts them (the collector rejects unknown keys at start-up, which no test here can run).

Transcribed from opentelemetry-collector-contrib's config structs (`mapstructure` tags) and
the generated `config.schema.yaml` of `processor/tailsamplingprocessor` and
`exporter/loadbalancingexporter`, the core `otlpexporter` / `configretry` /
`exporterhelper` queue settings and `processor/resourceprocessor`, with the CHANGELOG
fixing the version: `decision_wait_after_root_received` is new in 0.144.0; fields added
later (tail sampling's `sampling_strategy` in 0.149, `num_shards` in 0.159, the
loadbalancer's `routing_attributes`) and those whose first release could not be pinned
(`block_on_overflow`, `maximum_trace_size_bytes`, the `not` and `trace_flags` policies, the
loadbalancer's top-level queue and retry) are left out, so a config that uses one fails
here until someone checks it against the pinned release.

A schema is a dict of field → sub-schema; `LEAF` takes any scalar or list of scalars,
`[schema]` a list of items, and `ANY_MAP` a map of free keys (headers).
"""

from __future__ import annotations

from typing import Any

LEAF = "leaf"
ANY_MAP = "any-map"

RETRY = {  # configretry.BackOffConfig
    "enabled": LEAF,
    "initial_interval": LEAF,
    "randomization_factor": LEAF,
    "multiplier": LEAF,
    "max_interval": LEAF,
    "max_elapsed_time": LEAF,
}
QUEUE = {  # exporterhelper queue settings (the request-count form)
    "enabled": LEAF,
    "num_consumers": LEAF,
    "queue_size": LEAF,
    "blocking": LEAF,
    "storage": LEAF,
}
TLS = {  # configtls.ClientConfig
    "insecure": LEAF,
    "insecure_skip_verify": LEAF,
    "server_name_override": LEAF,
    "ca_file": LEAF,
    "ca_pem": LEAF,
    "cert_file": LEAF,
    "cert_pem": LEAF,
    "key_file": LEAF,
    "key_pem": LEAF,
    "min_version": LEAF,
    "max_version": LEAF,
    "reload_interval": LEAF,
}
OTLP_GRPC_EXPORTER = {  # otlpexporter.Config (`endpoint` is the resolver's inside loadbalancing)
    "endpoint": LEAF,
    "tls": TLS,
    "timeout": LEAF,
    "compression": LEAF,
    "headers": ANY_MAP,
    "balancer_name": LEAF,
    "keepalive": {"time": LEAF, "timeout": LEAF, "permit_without_stream": LEAF},
    "wait_for_ready": LEAF,
    "write_buffer_size": LEAF,
    "read_buffer_size": LEAF,
    "authority": LEAF,
    "auth": {"authenticator": LEAF},
    "sending_queue": QUEUE,
    "retry_on_failure": RETRY,
}

LOADBALANCING_EXPORTER = {
    "routing_key": LEAF,
    "protocol": {"otlp": OTLP_GRPC_EXPORTER},
    "resolver": {
        "static": {"hostnames": LEAF},
        "dns": {"hostname": LEAF, "port": LEAF, "interval": LEAF, "timeout": LEAF},
        "k8s": {"service": LEAF, "ports": LEAF, "timeout": LEAF, "return_hostnames": LEAF},
        "aws_cloud_map": {
            "namespace": LEAF,
            "service_name": LEAF,
            "port": LEAF,
            "health_status": LEAF,
            "interval": LEAF,
            "timeout": LEAF,
        },
    },
}
ROUTING_KEYS = {"traceID", "service", "resource", "metric", "streamID"}

# Each policy type's own config block (always_sample has none).
POLICY_CONFIGS: dict[str, dict[str, Any]] = {
    "latency": {"threshold_ms": LEAF, "upper_threshold_ms": LEAF},
    "numeric_attribute": {"key": LEAF, "min_value": LEAF, "max_value": LEAF, "invert_match": LEAF},
    "probabilistic": {"hash_salt": LEAF, "sampling_percentage": LEAF},
    "status_code": {"status_codes": LEAF},
    "string_attribute": {
        "key": LEAF,
        "values": LEAF,
        "enabled_regex_matching": LEAF,
        "cache_max_size": LEAF,
        "invert_match": LEAF,
    },
    "rate_limiting": {"spans_per_second": LEAF},
    "bytes_limiting": {"bytes_per_second": LEAF, "burst_capacity": LEAF},
    "span_count": {"min_spans": LEAF, "max_spans": LEAF},
    "trace_state": {"key": LEAF, "values": LEAF},
    "boolean_attribute": {"key": LEAF, "value": LEAF, "invert_match": LEAF},
    "ottl_condition": {"error_mode": LEAF, "span": LEAF, "spanevent": LEAF},
}
POLICY_TYPES = {"always_sample", "and", "drop", "composite", *POLICY_CONFIGS}
SUB_POLICY_TYPES = {"always_sample", *POLICY_CONFIGS}  # inside and / drop / composite
STATUS_CODES = {"OK", "ERROR", "UNSET"}
OTTL_ERROR_MODES = {"propagate", "ignore", "silent"}

TAIL_SAMPLING_PROCESSOR = {
    "decision_wait": LEAF,
    "decision_wait_after_root_received": LEAF,  # 0.144.0
    "num_traces": LEAF,
    "expected_new_traces_per_sec": LEAF,
    "decision_cache": {"sampled_cache_size": LEAF, "non_sampled_cache_size": LEAF},
    "sample_on_first_match": LEAF,
    "drop_pending_traces_on_shutdown": LEAF,
    "policies": "policies",  # checked by policy_errors
}

RESOURCE_PROCESSOR = {
    "attributes": [
        {
            "key": LEAF,
            "action": LEAF,
            "value": LEAF,
            "from_attribute": LEAF,
            "from_context": LEAF,
            "pattern": LEAF,
            "converted_type": LEAF,
        }
    ]
}
RESOURCE_ACTIONS = {"insert", "update", "upsert", "delete", "hash", "extract", "convert"}

SCHEMAS = {
    "loadbalancing": LOADBALANCING_EXPORTER,
    "tail_sampling": TAIL_SAMPLING_PROCESSOR,
    "resource": RESOURCE_PROCESSOR,
}


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def field_errors(value: Any, schema: Any, path: str) -> list[str]:
    """Keys the schema does not know, and values of the wrong shape, under `path`."""
    if schema == LEAF:
        ok = _is_scalar(value) or (isinstance(value, list) and all(map(_is_scalar, value)))
        return [] if ok else [f"{path}: expected a value, got {type(value).__name__}"]
    if schema == ANY_MAP:
        return [] if isinstance(value, dict) else [f"{path}: expected a map"]
    if schema == "policies":
        return policy_errors(value, path, POLICY_TYPES)
    if isinstance(schema, list):
        if not isinstance(value, list):
            return [f"{path}: expected a list"]
        return [
            e for i, item in enumerate(value) for e in field_errors(item, schema[0], f"{path}[{i}]")
        ]
    if value is None:
        return []  # `key:` with nothing: the component's defaults
    if not isinstance(value, dict):
        return [f"{path}: expected a map, got {type(value).__name__}"]
    errors = []
    for key, item in value.items():
        if key not in schema:
            errors.append(f"{path}.{key}: not a field of this component in contrib 0.144.0")
        else:
            errors.extend(field_errors(item, schema[key], f"{path}.{key}"))
    return errors


def policy_errors(policies: Any, path: str, types: set[str]) -> list[str]:
    """Each policy: a name, a known type and only that type's config block."""
    if not isinstance(policies, list) or not policies:
        return [f"{path}: policies must be a non-empty list"]
    errors = []
    names = [policy.get("name") for policy in policies if isinstance(policy, dict)]
    if len(set(names)) != len(names) or None in names:
        errors.append(f"{path}: every policy needs a distinct name")
    for index, policy in enumerate(policies):
        where = f"{path}[{index}]"
        if not isinstance(policy, dict):
            errors.append(f"{where}: expected a map")
            continue
        kind = policy.get("type")
        if kind not in types:
            errors.append(f"{where}: policy type {kind!r} is not one of contrib 0.144.0's")
            continue
        for key in set(policy) - {"name", "type", kind}:
            errors.append(f"{where}.{key}: not the config block of a {kind} policy")
        block = policy.get(kind)
        if kind in POLICY_CONFIGS:
            errors.extend(field_errors(block, POLICY_CONFIGS[kind], f"{where}.{kind}"))
        elif kind in ("and", "drop"):
            sub = (block or {}).get(f"{kind}_sub_policy")
            errors.extend(policy_errors(sub, f"{where}.{kind}.{kind}_sub_policy", SUB_POLICY_TYPES))
        elif kind == "composite":
            block = dict(block or {})
            sub = block.pop("composite_sub_policy", None)
            errors.extend(policy_errors(sub, f"{where}.composite", SUB_POLICY_TYPES))
            composite = {
                "max_total_spans_per_second": LEAF,
                "policy_order": LEAF,
                "rate_allocation": [{"policy": LEAF, "percent": LEAF}],
            }
            errors.extend(field_errors(block, composite, f"{where}.composite"))
    return errors


def component_errors(config: dict[str, Any]) -> list[str]:
    """Fields of every schema-known component (by type, `type/name` ids included)."""
    errors = []
    for kind in ("receivers", "processors", "exporters", "connectors"):
        for component_id, body in (config.get(kind) or {}).items():
            schema = SCHEMAS.get(component_id.split("/", 1)[0])
            if schema is not None:
                errors.extend(field_errors(body, schema, f"{kind}.{component_id}"))
    return errors
