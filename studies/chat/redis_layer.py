"""The Redis channel layer, made to ride out Redis being briefly unreachable.

The chat itself runs over the participant's own socket; Redis only carries the "another window
took over" notice between servers. So while Redis is away a group call is logged and skipped
(the conversation's row lock still keeps one reply per message), and a consumer's wait for
layer messages retries instead of raising: the socket stays open rather than dying with 1011.
"""

import asyncio
import logging

from channels_redis.core import RedisChannelLayer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)
MAX_WAIT = 10.0  # seconds between tries of a consumer's receive while Redis is away


class ResilientRedisChannelLayer(RedisChannelLayer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.groups_to_join: set[tuple[str, str]] = set()  # group_add calls made while away

    async def receive(self, channel):
        wait = 0.5
        while True:
            try:
                await self._join_groups_missed(channel)
                return await super().receive(channel)
            except UNREACHABLE as error:
                log.warning(
                    "channel layer unreachable, receive tried again in %.1f s: %s", wait, error
                )
                await asyncio.sleep(wait)
                wait = min(wait * 2, MAX_WAIT)

    async def group_add(self, group, channel):
        try:
            await super().group_add(group, channel)
        except UNREACHABLE as error:
            # Joined once Redis answers again, by this channel's next receive.
            log.warning("channel layer unreachable, group_add postponed: %s", error)
            self.groups_to_join.add((group, channel))

    async def group_discard(self, group, channel):
        self.groups_to_join.discard((group, channel))
        await self._skipped_while_away("group_discard", super().group_discard(group, channel))

    async def _join_groups_missed(self, channel) -> None:
        for group, member in sorted(self.groups_to_join):
            if member == channel:
                await super().group_add(group, channel)
                self.groups_to_join.discard((group, channel))

    async def group_send(self, group, message):
        await self._skipped_while_away("group_send", super().group_send(group, message))

    @staticmethod
    async def _skipped_while_away(what: str, call) -> None:
        try:
            await call
        except UNREACHABLE as error:
            log.warning("channel layer unreachable, %s skipped: %s", what, error)
