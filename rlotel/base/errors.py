"""The one exception rlotel raises at you: at `init`, for a configuration it cannot run."""


class ConfigError(ValueError):
    """A configuration rlotel cannot run with; the message says how to fix it."""
