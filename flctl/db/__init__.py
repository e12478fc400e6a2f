"""The run database: readers get a ``Store`` (flctl.db.store), workers a ``RunQueue`` over it (flctl.db.queue)."""

from flctl.db.claims import Claim
from flctl.db.counts import chunks, lost_cells, run_states
from flctl.db.liveness import HEARTBEAT_S, STALE_AFTER_S, check_stale_after, poll_delays
from flctl.db.queue import Ended, RunQueue
from flctl.db.schema import RunRecord
from flctl.db.store import Store, not_the_one
from flctl.db.upgrade import SCHEMA_LOCK
from flctl.db.urls import existing_storage, normalize_url

__all__ = ["HEARTBEAT_S", "SCHEMA_LOCK", "STALE_AFTER_S", "Claim", "Ended", "RunQueue", "RunRecord", "Store",
           "check_stale_after", "chunks", "existing_storage", "lost_cells", "normalize_url", "not_the_one", "poll_delays",
           "run_states"]
