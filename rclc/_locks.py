"""The two process-wide locks of the transfer core.

Attention capture swaps the model's attention dispatch, which is process-global state,
so every rclc forward (captures, rollouts, prefills) holds `attention_lock`. Selection
and sender snapshots hold `preparation_lock`, so concurrent transfers never run two
selectors at once. Order is always preparation -> attention, never the reverse. Both are
re-entrant so a helper that already holds one may call another helper that takes it.
"""

from __future__ import annotations

import threading

preparation_lock = threading.RLock()
attention_lock = threading.RLock()
