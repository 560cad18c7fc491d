"""Property-based fuzzing of phase names (hypothesis), then the names these properties found
to break `tel.phase` (a phase named `step`, a name whose repr raises) as regression tests.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.fuzzing import (
    SURROGATE_TEXT,
    dropped,
    encodable,
    exposition,
    fuzz,
    series,
    step_numbers,
)

PHASE_NAME = st.one_of(
    st.text(max_size=20),
    st.text(min_size=1, max_size=3).map(lambda s: s * 400),
    st.text(alphabet='\\"\n\r\t{}=,# é☃\x00\x7f\x85\u2028', min_size=1, max_size=12),
    st.sampled_from(["", "gen", 'say "hi"', "C:\\dir\\", "\\n", "line\nbreak", "}", "step"]),
    SURROGATE_TEXT,
    st.none(),
    st.integers(),
    st.floats(),
    st.binary(max_size=4),
    st.tuples(st.integers()),
)


class Boom(Exception):
    pass


def is_phase_name(name: Any) -> bool:
    """Non-empty valid UTF-8, and not "step" (the step's own timing key): else refused."""
    return isinstance(name, str) and bool(name) and encodable(name) and name != "step"


@fuzz(60)
@given(
    names=st.lists(PHASE_NAME, min_size=1, max_size=3),
    error=st.sampled_from([None, Boom, ValueError, KeyboardInterrupt, GeneratorExit]),
)
def test_phases_of_any_name_run_once_and_propagate_errors(fuzz_tel, names, error):
    raised = error("inside the phase") if error is not None else None
    entered: list[int] = []

    def nest(depth: int) -> None:
        if depth == len(names):
            entered.append(depth)
            if raised is not None:
                raise raised
            return
        with fuzz_tel.phase(names[depth]):
            entered.append(depth)
            nest(depth + 1)

    before = exposition(fuzz_tel)
    caught: BaseException | None = None
    try:
        with fuzz_tel.step(next(step_numbers)):
            nest(0)
    except BaseException as exc:
        caught = exc
    after = exposition(fuzz_tel)

    assert caught is raised
    assert entered == list(range(len(names) + 1))
    for name in {name for name in names if is_phase_name(name)}:
        assert series(after, "rlotel_step_phase_seconds", phase=name) is not None, name
        count = "rlotel_phase_duration_seconds_count"
        grown = (series(after, count, phase=name) or 0) - (series(before, count, phase=name) or 0)
        assert grown == 1, name
    n_bad = sum(not is_phase_name(name) for name in names)
    assert dropped(after, "spans", "bad_name") - dropped(before, "spans", "bad_name") == n_bad


# --- regressions: bugs these properties found, fixed ----------------------------------


def test_phase_named_step_is_kept_or_counted(fuzz_tel):
    before = dropped(exposition(fuzz_tel))
    with fuzz_tel.step(1):
        with fuzz_tel.phase("step"):
            pass
    after = exposition(fuzz_tel)
    kept = series(after, "rlotel_step_phase_seconds", phase="step") is not None
    assert kept or dropped(after) > before


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_a_name_whose_repr_raises_still_runs_the_body(fuzz_tel):
    ran = []
    with fuzz_tel.step(1), fuzz_tel.phase(BadRepr()):  # type: ignore[arg-type]
        ran.append(True)
    assert ran == [True]
