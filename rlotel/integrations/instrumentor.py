"""`opentelemetry-instrument python -m verl.trainer.main_ppo ...` switches rlotel on.

Registered under the `opentelemetry_instrumentor` entry-point group. Instrumenting sets
`RLOTEL_ENABLE=1` before verl is imported, so the verl plugin (loaded by `import verl` in
the driver and, through the inherited environment, in every Ray worker) installs itself;
configuration comes from the standard `OTEL_*` variables the command already honours.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from rlotel.base import env


class RlotelInstrumentor(BaseInstrumentor):
    def instrumentation_dependencies(self) -> Collection[str]:
        return ("verl >= 0.9",)

    def _instrument(self, **kwargs: Any) -> None:
        os.environ[env.RLOTEL_ENABLE] = "1"
        from rlotel.integrations import verl_cluster

        verl_cluster.warn_if_excluded()  # verl would not load the plugin: say so, once
        if "verl" in sys.modules:  # imported before us: install now rather than at import
            from rlotel.integrations import verl as plugin

            plugin.install()

    def _uninstrument(self, **kwargs: Any) -> None:
        os.environ.pop(env.RLOTEL_ENABLE, None)
        from rlotel.integrations import verl as plugin

        plugin.uninstall()
