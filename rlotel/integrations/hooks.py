"""The hook registry: every place rlotel wraps another library's code, declared once.

A `Hook` names one piece of telemetry (its name is the `{hook}` label of
`rlotel_integration_events_total`, `rlotel_integration_failures_total` and
`rlotel_integration_hooks`) and the attributes it replaces (`Target`s). Each target
attaches when its module is imported (a post-import hook, as verl or Ray import it), each
hook on its own: a hook whose target is missing, or whose wrapper raises while being made,
is *not attached* — one warning names it and what is lost — and every other hook stays.
`Registry.detach` puts back every object exactly as it was (an inherited attribute is
deleted again, not shadowed by a copy).

Replacements are plain functions, never proxies: Ray pickles some of the patched classes by
value. A `by_name` target's replacement is the function itself, which finds verl's original
through `Registry.original` when called (Ray copies those methods into the actor's class).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import threading
from collections.abc import Callable, Iterable
from enum import StrEnum
from types import ModuleType
from typing import Any, NamedTuple

from rlotel.base.hook_states import HOOK_EVENTS, HOOK_STATES
from rlotel.integrations import guard

log = logging.getLogger("rlotel")


class Target(NamedTuple):
    """One attribute a hook replaces."""

    module: str  # where it lives; the target attaches when this module is imported
    attribute: str  # "function" or "Class.method", inside `module`
    wrapper: str  # "rlotel.integrations.x:factory": factory(original) -> replacement
    by_name: bool = False  # the wrapper is the replacement itself (finds verl's by name)
    actor: bool = False  # the class is a Ray actor's: patch the class Ray made to host it
    since: str | None = None  # the version of its library that brought it (else: always)
    optional: bool = False  # missing here is no loss (a build without one collective)

    @property
    def where(self) -> str:
        return f"{self.module}.{self.attribute}"


class Hook:
    """One piece of telemetry, declared once (its row in `registered`), and what every
    wrapper of it codes against: its name (the `{hook}` label, spelled nowhere else), a
    guarded section that counts rlotel's failure and lets the library's code run as it was,
    `fired`, the original of what it replaced, run-time patches and per-hook state that
    detaching undoes and clears."""

    __slots__ = ("_registry", "gives", "library", "name", "on_demand", "state", "targets")

    def __init__(
        self,
        name: str,  # the {hook} label
        library: str,  # the distribution it patches: verl, ray, vllm, torch
        gives: str,  # the telemetry it gives: what is lost when it does not attach
        targets: tuple[Target, ...],
        on_demand: bool = False,  # attached by `Registry.attach` where wanted, not at import
    ) -> None:
        self.name, self.library, self.gives = name, library, gives
        self.targets, self.on_demand = targets, on_demand
        self.state: dict[str, Any] = {}  # what its wrappers keep in this process; cleared
        self._registry: Registry | None = None

    def __repr__(self) -> str:
        return f"Hook({self.name!r})"

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        """Pickled by reference (a wrapper Ray sends by value): the receiving process's own."""
        return _registered, (self.name,)

    # --- what its wrappers use ------------------------------------------------------------

    def guarded(self) -> _Guarded:
        """`with hook.guarded():` rlotel's part; its exception is counted under this hook and
        stops there (the library's code after the block runs as it would without rlotel)."""
        return _Guarded(self)

    def fault(self) -> None:
        """Test-only fault point, where rlotel's part starts its own work."""
        guard.fault(self.name)

    def failed(self, error: BaseException) -> None:
        guard.failed(self.name, error, self.gives)

    def attempt(self, function: Callable[..., Any], *args: Any) -> None:
        """rlotel's `function(*args)`, guarded."""
        with self.guarded():
            self.fault()
            function(*args)

    def exit_context(self, context: Any, raised: BaseException | None) -> bool:
        """`context.__exit__` after the wrapped call returned or raised `raised`: never
        raises (the call's own exception is the one that propagates); False when it failed."""
        with self.guarded():
            if raised is None:
                context.__exit__(None, None, None)
            else:
                context.__exit__(type(raised), raised, raised.__traceback__)
            return True
        return False

    def fired(self, seconds: float = 0.0) -> None:
        """This hook ran (`rlotel_integration_events_total{hook}`), costing the caller
        `seconds`: counted for the process, before its telemetry starts too."""
        HOOK_EVENTS.fired(self.name, seconds)

    def original(self, owner: Any, name: str) -> Any:
        """What `owner.name` was before this process's hooks replaced it."""
        return self._registry.original(owner, name) if self._registry else getattr(owner, name)

    def patch(self, owner: Any, name: str, replacement: Any) -> None:
        """A patch made at run time (a class Ray loads), undone with this hook's targets."""
        if self._registry is not None:
            self._registry.patch(self, owner, name, replacement)


_BY_NAME: dict[str, Hook] = {}  # the first registry's hook of each name: the process's own


def _registered(name: str) -> Hook:
    return _BY_NAME[name]


class _Guarded:
    __slots__ = ("_hook",)

    def __init__(self, hook: Hook) -> None:
        self._hook = hook

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> bool:
        if isinstance(error, Exception):
            self._hook.failed(error)
            return True
        return False


class State(StrEnum):
    ATTACHED = "attached"
    NOT_ATTACHED = "not_attached"  # a target is missing, or its patch raised
    NOT_APPLICABLE = "not_applicable"  # its library, module or feature is not in this install
    PENDING = "pending"  # its module exists and was not imported in this process (yet)


class Status(NamedTuple):
    state: State
    why: str = ""


class _Patch(NamedTuple):
    target: Target
    owner: Any
    attribute: str
    original: Any
    own: bool  # the attribute was in the owner's own __dict__ (else inherited)
    replacement: Any


def resolve(reference: str) -> Any:
    """`package.module:name` → the object."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def actor_class(remote: Any) -> Any:
    """The class a Ray actor runs: the one `@ray.remote` made to host verl's, which copied
    verl's methods into its own dict when the module was imported."""
    metadata = getattr(remote, "__ray_metadata__", None)
    return getattr(metadata, "modified_class", None) or remote


def _owner_and_name(module: ModuleType, target: Target) -> tuple[Any, str]:
    *path, name = target.attribute.split(".")
    owner: Any = module
    for part in path:
        owner = getattr(owner, part)
    if target.actor:
        owner = actor_class(owner)
    getattr(owner, name)  # AttributeError: the target moved
    return owner, name


class Registry:
    """The hooks of one process: what each replaced (to put back) and how each stands."""

    def __init__(self, hooks: Iterable[Hook], version: Callable[[str], str | None]) -> None:
        self.hooks = {hook.name: hook for hook in hooks}
        for hook in self.hooks.values():
            hook._registry = self
            _BY_NAME.setdefault(hook.name, hook)
        self._version = version  # a library's installed version, None when absent
        self._lock = threading.RLock()
        self._patches: dict[str, list[_Patch]] = {}  # by hook, in the order applied
        self._status: dict[str, Status] = {}  # decided hooks (attached or not)
        self._by_replacement: dict[int, Any] = {}  # id(replacement) -> what it replaced
        self._active = False
        self._registered = False  # wrapt's post-import hooks stay registered for good

    # --- attaching --------------------------------------------------------------------

    def attach_on_import(self) -> None:
        """Each target's module, when imported (at once if it is already), attaches it."""
        import sys

        import wrapt

        self._active = True
        modules = dict.fromkeys(
            t.module for h in self.hooks.values() if not h.on_demand for t in h.targets
        )
        if self._registered:  # attached again after a detach: the modules imported since
            for module in modules:
                if sys.modules.get(module) is not None:
                    self._imported(sys.modules[module])
            return
        self._registered = True
        for module in modules:
            wrapt.register_post_import_hook(self._imported, module)

    def _imported(self, module: ModuleType) -> None:
        if not self._active:
            return  # detached since
        with self._lock:
            for hook in self.hooks.values():
                if hook.on_demand:
                    continue
                for target in hook.targets:
                    if target.module == module.__name__:
                        self._attach(hook, target, module)
        self._publish()

    def attach(self, name: str) -> bool:
        """Attach hook `name` now, from the modules this process has imported (an on-demand
        hook where wanted; one hook alone in a test); whether it is attached."""
        import sys

        hook = self.hooks[name]
        with self._lock:
            for target in hook.targets:
                module = sys.modules.get(target.module)
                if module is not None:
                    self._attach(hook, target, module)
        self._publish()
        return self.status(name).state == State.ATTACHED

    def _attach(self, hook: Hook, target: Target, module: ModuleType) -> None:
        status = self._status.get(hook.name)
        if status is not None and status.state != State.ATTACHED:
            return  # given up on this hook
        if any(p.target == target for p in self._patches.get(hook.name, [])):
            return  # attached already
        try:
            owner, name = _owner_and_name(module, target)
        except AttributeError:
            if not target.optional:
                self._give_up(hook, target, self._missing(target))
            return
        try:
            current = getattr(owner, name)
            original = self._by_replacement.get(id(current), current)
            made = resolve(target.wrapper)
            replacement = made if target.by_name else made(original)
            own = name in vars(owner)
            setattr(owner, name, replacement)
        except Exception as error:
            self._give_up(hook, target, Status(State.NOT_ATTACHED, f"its patch raised {error!r}"))
            return
        self._by_replacement[id(replacement)] = original
        self._patches.setdefault(hook.name, []).append(
            _Patch(target, owner, name, original, own, replacement)
        )
        self._status[hook.name] = Status(State.ATTACHED)

    def _missing(self, target: Target) -> Status:
        library = next(h.library for h in self.hooks.values() if target in h.targets)
        if target.since is not None and _older(self._version(library), target.since):
            return Status(State.NOT_APPLICABLE, f"{target.where} came with {target.since}")
        return Status(State.NOT_ATTACHED, f"{target.where} is missing")

    def _give_up(self, hook: Hook, target: Target, status: Status) -> None:
        """This hook stays off in this process; what of it was attached is put back."""
        self._undo(hook.name)
        self._status[hook.name] = status
        if status.state == State.NOT_ATTACHED:
            log.warning(
                "rlotel: the %s hook is not attached (%s); lost: %s. Every other hook works",
                hook.name,
                status.why,
                hook.gives,
            )

    # --- detaching --------------------------------------------------------------------

    def detach(self) -> None:
        """Every hook undone, newest first; each patched object exactly as it was."""
        with self._lock:
            self._active = False
            for name in reversed(list(self._patches)):
                self._undo(name)
            for hook in self.hooks.values():
                hook.state.clear()
            self._status.clear()
            self._by_replacement.clear()
        self._publish()

    def detach_hook(self, name: str) -> None:
        """Hook `name` undone and forgotten (the rest stay as they are)."""
        with self._lock:
            self._undo(name)
            self.hooks[name].state.clear()
            self._status.pop(name, None)
        self._publish()

    def patch(self, hook: Hook, owner: Any, name: str, replacement: Any) -> None:
        """`owner.name = replacement` at run time, for `hook` (undone with it)."""
        with self._lock:
            current = getattr(owner, name)
            original = self._by_replacement.get(id(current), current)
            target = Target(getattr(owner, "__module__", ""), f"{owner.__qualname__}.{name}", "")
            patch = _Patch(target, owner, name, original, name in vars(owner), replacement)
            setattr(owner, name, replacement)
            self._by_replacement[id(replacement)] = original
            self._patches.setdefault(hook.name, []).append(patch)

    def _undo(self, name: str) -> None:
        for patch in reversed(self._patches.pop(name, [])):
            if patch.own:
                setattr(patch.owner, patch.attribute, patch.original)
            elif patch.attribute in vars(patch.owner):
                delattr(patch.owner, patch.attribute)
            self._by_replacement.pop(id(patch.replacement), None)

    # --- reading ----------------------------------------------------------------------

    def original(self, owner: Any, name: str) -> Any:
        """What `owner.name` was before a hook replaced it (else what it is)."""
        current = getattr(owner, name)
        return self._by_replacement.get(id(current), current)

    @property
    def active(self) -> bool:
        return self._active

    def status(self, name: str) -> Status:
        """How hook `name` stands in this process now."""
        with self._lock:
            decided = self._status.get(name)
        if decided is not None:
            return decided
        hook = self.hooks[name]
        if self._version(hook.library) is None:
            return Status(State.NOT_APPLICABLE, f"{hook.library} is not installed")
        absent = [why for t in hook.targets if (why := absence(t.module)) is not None]
        if len(absent) == len(hook.targets):
            return Status(State.NOT_APPLICABLE, f"{absent[0]} in this {hook.library}")
        return Status(State.PENDING, "its module was not imported in this process")

    def statuses(self) -> dict[str, Status]:
        return {name: self.status(name) for name in self.hooks}

    def _publish(self) -> None:
        """The series `rlotel_integration_hooks{hook,state}` reads these."""
        with self._lock:
            HOOK_STATES.set({name: status.state.value for name, status in self._status.items()})


def absence(module: str) -> str | None:
    """Why `module` cannot be imported ("no module ...", or its package fails to import:
    V1's needs TransferQueue), None when it can; finding it imports its parents only."""
    try:
        if importlib.util.find_spec(module) is not None:
            return None
    except ModuleNotFoundError as error:  # its parent is missing, or a parent's import is
        missing = error.name or ""
        if not (module == missing or module.startswith(missing + ".")):
            return f"module {module}: its package does not import ({error})"
    except ImportError as error:
        return f"module {module}: its package does not import ({error!r})"
    except ValueError:
        pass
    return f"no module {module}"


def _older(version: str | None, since: str) -> bool:
    """False where the version cannot be read (a tree saying `unknown`): its hooks are tried."""
    from packaging.version import InvalidVersion, Version

    try:
        return version is not None and Version(version) < Version(since)
    except InvalidVersion:
        return False
