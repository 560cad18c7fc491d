"""The real runs start ahead (`tests.e2e.ahead`): the tests that read them go last, and their
runs start, in the order those tests need them, as soon as collection ends; quiet runs and
`timing` tests last of all. They run the engine venv's rlotel wheel: one older than the tree
(`tests.e2e.wheel_sources`) starts no run, and each test that reads one fails saying so."""

from __future__ import annotations

import pytest

from tests.e2e import ahead, wheel_sources

STALE_WHEEL = pytest.StashKey[str]()


def run_keys(item: pytest.Item) -> list[str]:
    """The declared runs an item reads, through its fixtures (`name[param]` where the
    fixture is parametrized)."""
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    keys = (f"{name}[{params[name]}]" if name in params else name for name in item.fixturenames)
    return [key for key in keys if key in ahead.RUNS]


@pytest.hookimpl(trylast=True)  # after pytest grouped the items by their fixtures
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order: the tests that read no run (beside the runs), those that read a run, those
    that read a quiet one, then the `timing` tests (each group in pytest's order)."""

    def group(item: pytest.Item) -> int:
        keys = run_keys(item)
        if item.get_closest_marker("timing"):
            return 3
        if any(ahead.RUNS[key].quiet for key in keys):
            return 2
        return 1 if keys else 0

    items.sort(key=group)  # stable
    if config.option.collectonly:
        return
    keys = dict.fromkeys(key for item in items for key in run_keys(item))
    if not keys:
        return
    stale = wheel_sources.stale(wheel_sources.ROOT, wheel_sources.RECORD)
    if stale:
        config.stash[STALE_WHEEL] = stale
        return
    ahead.start(list(keys))


@pytest.hookimpl(tryfirst=True)  # before the fixtures that wait for a run
def pytest_runtest_setup(item: pytest.Item) -> None:
    stale = item.config.stash.get(STALE_WHEEL, None)
    if stale and run_keys(item):
        pytest.fail(stale, pytrace=False)
    if run_keys(item) or item.get_closest_marker("timing"):
        ahead.mark_rest_done()  # the tests that read no run are done: quiet runs may start


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The real runs' own times (their tests' set-up times in `--durations` are waits), with
    when each started and when the rest of the suite was done, from the end of collection:
    what decides the suite's length."""
    walls = ahead.walls()
    if walls:
        terminalreporter.section("real runs, started ahead")
        terminalreporter.write_line("  start s   wall s  run")
        for key, started_s, wall_s in walls:
            if started_s is None or wall_s is None:
                terminalreporter.write_line(f"{'':>17}  {key} (did not run to an end)")
                continue
            terminalreporter.write_line(f"{started_s:8.1f} {wall_s:8.1f}  {key}")
        if ahead.rest_done_s is not None:
            rest = f"{ahead.rest_done_s:8.1f}"
            terminalreporter.write_line(f"{rest}{'':9}  the rest of the suite done")
    if ahead.FIGURES:
        terminalreporter.section("what the real runs showed")
        for test, line in ahead.FIGURES:
            terminalreporter.write_line(f"{test}: {line.strip()}")


def pytest_sessionfinish() -> None:
    ahead.stop()
