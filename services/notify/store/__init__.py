"""notify's store: the only code in notify that runs SQL (tables.py and the migrations
aside). One module per table group, each statement named with the index it rides; every
public method turns a database that does not answer into notify's DatabaseFailed
(boundary.py).

- projection.py: notify.job_states, written by Deliver (version-gated), read by job/user;
- stream_reads.py: the streams' reads of notify.job_states (first state, snapshot,
  backstop);
- feed_reads.py: the job feed's reads of notify.job_states (its start, pages after a
  cursor);
- tokens.py: notify.push_tokens as clients register and remove them;
- pushes.py: notify.pushes as Deliver and registrations record them (inside their
  transactions);
- sender.py: the APNs sender's claims and outcomes (notify.pushes, push_attempts);
- failed_pushes.py: operators' read of the pushes that did not reach a device;
- doctor.py: the read of `atelier push doctor`.
"""

from services.notify.store.failed_pushes import FailedPushReads
from services.notify.store.feed_reads import FeedReads
from services.notify.store.projection import ProjectionStore
from services.notify.store.sender import PushStore
from services.notify.store.stream_reads import StreamReads
from services.notify.store.tokens import TokenStore

__all__ = [
    "FailedPushReads",
    "FeedReads",
    "ProjectionStore",
    "PushStore",
    "StreamReads",
    "TokenStore",
    "doctor",
    "sender",
]
