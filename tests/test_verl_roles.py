"""A process hosting several of verl's workers (its colocated `WorkerDict`: actor and critic,
actor and ref) is named by its main role, never by one it only co-hosts; each worker call's
span carries the role of the worker verl routed it to."""

from __future__ import annotations

import pytest

from rlotel.integrations import verl_workers
from rlotel.schema import attributes as attr

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class WorkerDict:
    """Stand-in of verl's colocated worker: what rlotel reads of it is its role keys."""

    def __init__(self, *keys: str) -> None:
        self.worker_dict = dict.fromkeys(keys)


@pytest.mark.parametrize(
    ("keys", "role"),
    [
        (("actor_rollout", "critic"), "actor"),  # PPO with a critic, colocated
        (("actor", "ref"), "actor"),
        (("actor_rollout_ref", "critic", "rm"), "actor"),
        (("critic", "rm"), "critic"),
        (("critic",), "critic"),
        (("ref",), "ref"),
    ],
)
def test_the_process_is_named_by_its_main_role(keys: tuple[str, ...], role: str) -> None:
    assert verl_workers._verl_role(WorkerDict(*keys)) == role


def test_each_call_carries_the_role_of_its_worker(make_tel, span_exporter) -> None:
    worker = WorkerDict("actor_rollout_ref", "critic")  # verl fuses the reference in
    tel = make_tel(resource_attributes={attr.ROLE: verl_workers._verl_role(worker)})
    for method in (
        "actor_rollout_ref_update_actor",
        "critic_update_critic",
        "critic_compute_values",
        "actor_rollout_ref_compute_ref_log_prob",  # the reference policy's model
    ):
        call = verl_workers._begin_call(
            worker, method, (), {verl_workers.RAY_CONTEXT_KWARG: {"traceparent": TRACEPARENT}}
        )
        assert call is not None and call.end(None, "result") == "result"
    assert tel.flush(10)
    roles = {
        span.name: span.attributes.get(attr.ROLE) for span in span_exporter.get_finished_spans()
    }
    assert roles == {
        "update_actor": "actor",
        "update_critic": "critic",
        "compute_values": "critic",
        "compute_ref_log_prob": "ref",
    }
    assert {span.resource.attributes[attr.ROLE] for span in span_exporter.get_finished_spans()} == {
        "actor"
    }
