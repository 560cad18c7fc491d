"""Each name rlotel shares with the outside world is spelled in one module.

Span and resource attribute names (`rl.*`, `gen_ai.*`, the OTel names rlotel uses) live in
`rlotel/schema/attributes.py`; verl's timer names, agent-loop stages, per-sample fields and metric
key prefixes live in `rlotel/schema/vocabulary.py`. Every other module imports them. This test
parses every module of `rlotel/` and fails on a string literal that *is* such a name (the
whole literal, or the start of one piece of an f-string) anywhere else.

Not flagged, by rule: docstrings and other bare string statements (prose), and text that
merely mentions a name inside a sentence (an error message saying "set rl.role" is prose;
a literal that starts with `rl.` is a name). `"step"` is not checked as a phase name: it is
also the field name of every step-numbered record (verl's `{"step": n, "data": ...}` log
lines, report rows, evidence), so a literal cannot tell the two apart; use
`vocabulary.STEP` for the timer. The few literals that are another thing spelled the same
way are listed in `ALLOWED`, each with its reason; an entry that no longer matches fails.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import rlotel
from rlotel.schema import attributes as attr
from rlotel.schema import vocabulary as voc

PACKAGE = Path(rlotel.__file__).parent
ATTRIBUTES = "schema/attributes.py"
VOCABULARY = "schema/vocabulary.py"

# Attribute names: rlotel's namespace, the GenAI one, and every dotted name attributes.py
# defines (service.name, process.pid, the profile.capture span ...).
ATTRIBUTE_PREFIXES = (attr.NAMESPACE, attr.INPUT_TOKENS.partition(".")[0] + ".")
_DOTTED = re.compile(r"[a-z_]+(\.[a-z0-9_]+)+\.?")
ATTRIBUTE_NAMES = frozenset(
    value for value in vars(attr).values() if isinstance(value, str) and _DOTTED.fullmatch(value)
)

# verl's metric keys (and rlotel's own step keys next to them), by prefix.
KEY_PREFIXES = (
    voc.TIMING_S,
    voc.TIMING_PER_TOKEN_MS,
    voc.PERF,
    voc.AGENT_LOOP,
    voc.TRAINING,
    voc.VALIDATION,
    voc.RLOTEL,
)

# verl's timer (phase) names, the windows rlotel adds, the agent loop's per-sample stages
# and fields: exact literals.
PHASE_NAMES = frozenset(
    {
        *voc.VERL_STAGE_ORDER,
        *voc.VERL_ASYNC_STAGES,
        *voc.ROLLOUT_WINDOWS,
        voc.TESTING,
        voc.START_PROFILE,
        voc.STOP_PROFILE,
        *voc.AGENT_LOOP_STAGES,
        voc.NUM_PREEMPTED,
        voc.PROMPT_LENGTH,
        voc.RESPONSE_LENGTH,
        voc.SAMPLE_REWARD,
    }
)

# (module path under rlotel/, literal) → why it is not the name it looks like.
ALLOWED: dict[tuple[str, str], str] = {
    ("offline/otlp_json.py", "values"): "OTLP/JSON's field of an arrayValue/kvlistValue",
    (ATTRIBUTES, "reward"): "the value of gen_ai.evaluation.name for the RL reward",
}


class Literal(NamedTuple):
    path: str  # relative to rlotel/
    line: int
    column: int
    value: str


class Stray(NamedTuple):
    literal: Literal
    kind: str
    owner: str

    def __str__(self) -> str:
        where = f"rlotel/{self.literal.path}:{self.literal.line}"
        return f"{where}: {self.literal.value!r} is {self.kind}: import it from rlotel/{self.owner}"


def literals(source: str, path: str) -> Iterator[Literal]:
    """Every string constant of a module that is a value, not prose: docstrings and any
    other bare string statement are skipped; f-strings yield their constant pieces."""
    tree = ast.parse(source, path)
    prose = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            yield Literal(path, node.lineno, node.col_offset, node.value)


def classify(value: str) -> tuple[str, str] | None:
    """(what the literal is, the module that owns it), or None for an ordinary string."""
    if value.startswith(ATTRIBUTE_PREFIXES) or value in ATTRIBUTE_NAMES:
        return "an attribute name", ATTRIBUTES
    if value.startswith(KEY_PREFIXES):
        return "a verl metric key", VOCABULARY
    if value in PHASE_NAMES:
        return "a verl phase, stage or per-sample field name", VOCABULARY
    return None


def strays(modules: dict[str, str]) -> tuple[list[Stray], set[tuple[str, str]]]:
    """Names spelled outside their owner, and the ALLOWED entries that matched."""
    found: list[Stray] = []
    used: set[tuple[str, str]] = set()
    for path, source in sorted(modules.items()):
        for literal in sorted(literals(source, path)):
            kind = classify(literal.value)
            if kind is None or path == kind[1]:
                continue
            if (path, literal.value) in ALLOWED:
                used.add((path, literal.value))
                continue
            found.append(Stray(literal, *kind))
    return found, used


def package_modules() -> dict[str, str]:
    return {
        path.relative_to(PACKAGE).as_posix(): path.read_text() for path in PACKAGE.rglob("*.py")
    }


def test_every_shared_name_is_spelled_by_its_owner() -> None:
    modules = package_modules()
    assert len(modules) > 40  # the walk found the package, demo and integrations included
    found, used = strays(modules)
    assert [str(stray) for stray in found] == []
    assert sorted(set(ALLOWED) - used) == []  # an exception that no longer applies goes


def test_the_owners_define_what_the_checker_looks_for() -> None:
    names = {"rl.step", "gen_ai.usage.input_tokens", "service.name", "process.pid"}
    assert names <= ATTRIBUTE_NAMES
    assert {"old_log_prob", "update_actor", "generate_sequences", "num_preempted"} <= PHASE_NAMES
    assert voc.STEP not in PHASE_NAMES  # see the module docstring


def test_the_checker_finds_a_stray_literal() -> None:
    source = '''
"""Docstrings may say rl.step, timing_s/gen and old_log_prob freely."""
KEY = "timing_s/gen"
def f(span, name):
    """So may a function's."""
    span.attributes.get("rl.step")
    span.attributes.get(f"rl.sample.{name}_s")
    message = f"set rl.role for {name}"  # prose that mentions a name: fine
    return name == "old_log_prob", {"gen_ai.usage.output_tokens": 1}, "values", "step"
'''
    found, _ = strays({"example.py": source})
    assert [(s.literal.line, s.literal.value, s.owner) for s in found] == [
        (3, "timing_s/gen", VOCABULARY),
        (6, "rl.step", ATTRIBUTES),
        (7, "rl.sample.", ATTRIBUTES),
        (9, "old_log_prob", VOCABULARY),
        (9, "gen_ai.usage.output_tokens", ATTRIBUTES),
        (9, "values", VOCABULARY),
    ]
    assert strays({VOCABULARY: 'KEY = "timing_s/"'})[0] == []  # the owner spells it
