"""Input assets media has already vouched for, so repeated submits skip the GetAssetInfo
call (a whole RPC, ~2 ms, on every submit).

Only the answer "ready, this user's own, an input photo" is remembered: media never takes
any of those back (an asset does not change owner or purpose, and a ready one never goes
back to uploading). Deletion is the one change that can follow, so an entry lives
ATELIER_ASSET_CACHE_TTL seconds at most. A job submitted on an input deleted within that
window is still made, and fails at the worker with INPUT_UNREADABLE (its points are
released), as a job whose input is deleted after submitting does. Refusals (unknown,
someone else's, deleted, wrong purpose, not ready yet) are never remembered: they are
asked again every time. The size is bounded; the least recently vouched-for go first.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class ReadyInputs:
    def __init__(
        self,
        ttl_seconds: float,
        max_entries: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl = ttl_seconds
        self._max_entries = max_entries
        self._clock = clock
        # asset id -> (owner, when the entry stops counting)
        self._entries: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def vouched(self, user_id: str, asset_id: str) -> bool:
        """True when media said, less than the TTL ago, that this asset is a ready input
        photo of this user."""
        entry = self._entries.get(asset_id)
        if entry is None:
            return False
        owner, expires_at = entry
        if self._clock() >= expires_at:
            del self._entries[asset_id]
            return False
        return owner == user_id

    def remember(self, user_id: str, asset_id: str) -> None:
        """Records media's "ready, yours, an input photo" for this asset."""
        if self._ttl <= 0 or self._max_entries <= 0:
            return
        self._entries[asset_id] = (user_id, self._clock() + self._ttl)
        self._entries.move_to_end(asset_id)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def forget(self, asset_id: str) -> None:
        """This process deleted the asset: stop vouching for it at once."""
        self._entries.pop(asset_id, None)

    def __len__(self) -> int:
        return len(self._entries)
