"""Whether a resume may import the code a run names without being told `--trust-code` again.

A run started with trust_code imports code its topology names (function nodes, routers,
tools, selectors). Resuming it imports that code again. Asking for `--trust-code` a second
time protected against one thing: a run directory that did not come from you (copied from
elsewhere, or edited to name other code) making a plain `rclc-graph resume` run its code.
Trusting whatever record.json says would lose that, since anyone who can write the file can
set `trust_code: true`.

So a run started with trust_code carries a seal: an HMAC-SHA256, under a key private to this
user on this machine, of the run id, the plan's fingerprint (which covers the whole topology,
every code reference in it, the inputs and trust_code) and the topology's directory (where
modules beside the topology file are imported from). A resume without
trust_code accepts the run as trusted only when the seal verifies: the same user on the same
machine started it with trust_code and its code references are unchanged. A record copied
from another machine or user, or edited, does not verify, and still needs `--trust-code`.

The key is 32 random bytes in `$XDG_CONFIG_HOME/rclc-graph/trust-key` (default
`~/.config/rclc-graph/trust-key`), mode 0600, made on first use. Deleting it revokes every
seal (resumes then ask for `--trust-code` again).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
from pathlib import Path
from typing import Any, Mapping

KEY_BYTES = 32
_lock = threading.Lock()


def key_path() -> Path:
    """Where this user's sealing key lives."""
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "rclc-graph" / "trust-key"


def _key(create: bool) -> bytes | None:
    """This user's key (made atomically on first use when `create`), or None."""
    path = key_path()
    with _lock:
        try:
            data = path.read_bytes()
            return data if len(data) == KEY_BYTES else None  # a damaged key verifies nothing
        except FileNotFoundError:
            if not create:
                return None
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        staging = path.with_name(f".trust-key.{os.getpid()}.{secrets.token_hex(4)}")
        descriptor = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(secrets.token_bytes(KEY_BYTES))
                handle.flush()
                os.fsync(handle.fileno())
            try:
                os.link(staging, path)  # atomic, and never replaces a key another process made first
            except FileExistsError:
                pass
        finally:
            staging.unlink(missing_ok=True)
        data = path.read_bytes()
        return data if len(data) == KEY_BYTES else None


def _mac(key: bytes, run_id: str, fingerprint: str, base_dir: str | None) -> str:
    message = f"rclc-graph trusted run\0{run_id}\0{fingerprint}\0{base_dir or ''}"
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


def seal(run_id: str, fingerprint: str, base_dir: str | None) -> str | None:
    """The seal of a run started with trust_code (None when no key can be made, e.g. a
    read-only home: resumes then ask for --trust-code, as before)."""
    try:
        key = _key(create=True)
    except OSError:
        return None
    return None if key is None else _mac(key, run_id, fingerprint, base_dir)


def sealed(record: Mapping[str, Any]) -> bool:
    """Whether `record` was started with trust_code by this user on this machine, with the
    code references (the plan fingerprint) it has now."""
    plan = record.get("plan")
    if not isinstance(plan, Mapping) or plan.get("trust_code") is not True:
        return False
    given, fingerprint, run_id = plan.get("trust_seal"), plan.get("fingerprint"), record.get("run_id")
    base_dir = (record.get("topology") or {}).get("base_dir") if isinstance(record.get("topology"), Mapping) else None
    if not all(isinstance(value, str) for value in (given, fingerprint, run_id)):
        return False
    if base_dir is not None and not isinstance(base_dir, str):
        return False
    try:
        key = _key(create=False)
    except OSError:
        return False
    return key is not None and hmac.compare_digest(_mac(key, run_id, fingerprint, base_dir), given)
