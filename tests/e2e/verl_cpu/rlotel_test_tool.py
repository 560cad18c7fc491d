"""Test stand-in, not part of rlotel: a toy tool for verl 0.9.1's tool agent loop
(`tool_agent`), and the tool-call format of the toy model that calls it.

verl loads the tool from `rlotel_test_tool.yaml` (`multi_turn.tool_config_path`) in each
agent-loop worker; importing this module there also registers the format
(`multi_turn.format=rlotel_test_toy`) with verl's `ToolParser` registry, the way verl adds a
model family's format. The e2e model has random weights and cannot write verl's hermes
`<tool_call>` JSON, so its format is: a model turn that ends in a token with a digit is one
call of the toy tool with that turn's text (verl stops generation there through the parser's
`stop_token_ids`, as it does for models that need an explicit stop after a call); a turn
that ends otherwise answers. Turns, tool calls, their order and the trajectory's end are
verl's own loop's.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse

FORMAT = "rlotel_test_toy"


class ToyCalculator(BaseTool):
    """Adds the digits of the text it is given, after the latency its config sets
    (`seconds`: each of its execute_tool spans lasts at least that long)."""

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs
    ) -> tuple[ToolResponse, float, dict]:
        deadline = time.time() + self.config["seconds"]  # the wall clock spans are timed by
        while (left := deadline - time.time()) > 0:
            await asyncio.sleep(left)
        total = sum(int(c) for c in str(parameters.get("text", "")) if c.isdigit())
        return ToolResponse(text=str(total)), 0.0, {}


@ToolParser.register(FORMAT)
class ToyToolParser(ToolParser):
    """A turn ending in a digit token calls the first tool with the turn's text."""

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer)
        vocabulary = tokenizer.get_vocab().values()
        self._digits = sorted(
            i for i in vocabulary if any(c.isdigit() for c in tokenizer.decode([i]))
        )

    @property
    def stop_token_ids(self) -> list[int]:
        return self._digits

    async def extract_tool_calls(self, responses_ids: list[int], tools=None):
        text = self.tokenizer.decode(responses_ids, skip_special_tokens=True)
        if not tools or not responses_ids or responses_ids[-1] not in self._digits:
            return text, []
        arguments = json.dumps({"text": text})
        return text, [FunctionCall(name=tools[0].function.name, arguments=arguments)]
