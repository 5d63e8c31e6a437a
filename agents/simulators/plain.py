"""The single-simulator baseline: one sampled reply per turn."""

from __future__ import annotations

from agents.domains.base import Domain, Message, Scenario
from agents.simulators.base import Simulator, UserTurn


class PlainSimulator(Simulator):
    async def reply(
        self, domain: Domain, scenario: Scenario, conversation: list[Message]
    ) -> UserTurn:
        messages = self.messages(domain, scenario, conversation)
        result = await self.client.chat(self.model, messages, **self.params)
        raw = result.content or ""
        return UserTurn(text=raw.strip(), raw=raw, usage=[result.usage])
