"""Load on `rclc-graph serve` over loopback: N submitted runs, C concurrent SSE clients.

Workload: a server subprocess (`python -m rclc_graph serve`, embedded SmolLM2-135M, fp32 CPU)
with `--max-concurrent` slots and a `--max-queue`; after one warm-up run (the model loads),
`--runs` fanout_qa submissions arrive at once (each with its own question and documents), so
the slots fill, the queue fills and the rest is refused with 429 + Retry-After. `--clients`
threads read the accepted runs' Server-Sent Events at the same time, each following its share
of the runs to their end: `--slow-clients` of them take `--slow-ms` per event (backpressure),
one drops its connection after a few events and reconnects with Last-Event-ID.

Checked and reported: every submission is accepted (202) or refused (429 with Retry-After);
every accepted run finishes; every client received every event of each run it followed, in
order, exactly as the run's events.jsonl holds them (no event lost or duplicated); the server
process's RSS (sampled every 100 ms from /proc) after the warm-up and at its peak.

Run: python benchmarks/serve_load.py [--runs 32] [--clients 16] [--max-concurrent 4] [--max-queue 12]
Prints one JSON object. The whole thing stops by itself (--timeout, default 900 s).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
BRIDGES = ["Cedar", "Birch", "Maple", "Aspen", "Rowan", "Alder", "Hazel", "Willow"]
FOUNDERS = ["Ada Holm", "Bo Lind", "Cai Moreau", "Dita Shah", "Eli Park", "Fay Okafor", "Gus Rossi", "Hana Ito"]


def inputs_for(index: int) -> dict[str, Any]:
    bridge, founder = BRIDGES[index % len(BRIDGES)], FOUNDERS[(index // len(BRIDGES)) % len(FOUNDERS)]
    company = f"{founder.split()[1]} Steel Company"
    return {
        "question": f"Who founded the company that built the {bridge} bridge?",
        "documents": [
            f"The {bridge} bridge was built in {1900 + index} by the {company}.",
            f"{company} was founded by {founder} in {1850 + index} in a small workshop.",
            f"The bridge was repainted in {1950 + index} and again in {2000 + index}.",
        ],
    }


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.samples = pid, 0, 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
                self.samples += 1
            except OSError:
                return
            time.sleep(0.1)


def sse(lines: Any) -> Any:
    fields: dict[str, str] = {}
    for line in lines:
        if line == "":
            if "data" in fields:
                yield fields.get("id"), fields.get("event"), json.loads(fields["data"])
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value


def follow(url: str, run_id: str, *, slow: float, drop_after: int | None, deadline: float) -> dict[str, Any]:
    """Read one run's events to its end (reconnecting once when asked); what was received."""
    received: list[dict[str, Any]] = []
    status = None
    reconnects = 0
    with httpx.Client(base_url=url, timeout=120) as client:
        while status is None and time.monotonic() < deadline:
            headers = {"Last-Event-ID": received[-1]["id_"]} if received else {}
            with client.stream("GET", f"/runs/{run_id}/events", headers=headers) as response:
                for event_id, kind, data in sse(response.iter_lines()):
                    if kind == "end":
                        status = data["status"]
                        break
                    received.append({**data, "id_": event_id})
                    if slow:
                        time.sleep(slow)
                    if drop_after is not None and len(received) == drop_after and not reconnects:
                        reconnects += 1
                        break  # drop the connection; the loop reconnects with Last-Event-ID
    return {"run_id": run_id, "status": status, "events": received, "reconnects": reconnects}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=32)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-concurrent", type=int, default=4)
    parser.add_argument("--max-queue", type=int, default=12)
    parser.add_argument("--slow-clients", type=int, default=3)
    parser.add_argument("--slow-ms", type=float, default=20.0)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--runs-dir", type=Path, default=None)
    args = parser.parse_args()
    deadline = time.monotonic() + args.timeout
    runs_dir = args.runs_dir or Path(os.environ.get("TMPDIR", "/tmp")) / f"serve-load-{os.getpid()}"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    log = open(runs_dir.parent / f"{runs_dir.name}.log", "wb") if runs_dir.parent.is_dir() else subprocess.DEVNULL
    server = subprocess.Popen(
        [sys.executable, "-m", "rclc_graph", "serve", "--topologies", str(ROOT / "topologies"), "--runs", str(runs_dir),
         "--port", str(port), "--max-concurrent", str(args.max_concurrent), "--max-queue", str(args.max_queue),
         "--log-level", "warning"],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=log, stderr=subprocess.STDOUT)
    try:
        return run(args, url, server, runs_dir, deadline)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()


def run(args: argparse.Namespace, url: str, server: subprocess.Popen, runs_dir: Path, deadline: float) -> int:
    client = httpx.Client(base_url=url, timeout=120)
    while True:
        try:
            if client.get("/server").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the server did not start")
        time.sleep(0.2)
    warm = client.post("/runs", json={"topology": "fanout_qa", "inputs": inputs_for(999)}).json()["run_id"]
    follow(url, warm, slow=0, drop_after=None, deadline=deadline)
    baseline = rss_bytes(server.pid)
    sampler = RssSampler(server.pid)
    sampler.start()

    began = time.monotonic()
    accepted, refused, other = [], [], []
    first_refused: int | None = None  # index of the first submission refused
    for index in range(args.runs):
        response = client.post("/runs", json={"topology": "fanout_qa", "inputs": inputs_for(index)})
        if response.status_code == 202:
            accepted.append(response.json()["run_id"])
        elif response.status_code == 429 and int(response.headers.get("retry-after", "0")) >= 1:
            refused.append(int(response.headers["retry-after"]))
            first_refused = index if first_refused is None else first_refused
        else:
            other.append(response.status_code)
    shares: list[list[str]] = [accepted[index::args.clients] for index in range(args.clients)]
    results: list[dict[str, Any]] = []
    lock = threading.Lock()
    peak_streams = 0

    def client_thread(number: int) -> None:
        slow = args.slow_ms / 1000 if number < args.slow_clients else 0.0
        drop = 5 if number == args.clients - 1 else None
        for run_id in shares[number]:
            outcome = follow(url, run_id, slow=slow, drop_after=drop, deadline=deadline)
            outcome.update(client=number, slow=bool(slow))
            with lock:
                results.append(outcome)

    threads = [threading.Thread(target=client_thread, args=(number,)) for number in range(args.clients)]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        try:
            peak_streams = max(peak_streams, client.get("/server").json()["streams"])
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    seconds = time.monotonic() - began
    sampler.done.set()
    sampler.join()

    lost = duplicated = mismatched = 0
    statuses: dict[str, int] = {}
    events = 0
    for outcome in results:
        statuses[str(outcome["status"])] = statuses.get(str(outcome["status"]), 0) + 1
        logged = [json.loads(line) for line in (runs_dir / outcome["run_id"] / "events.jsonl").read_text().splitlines()]
        got = [int(event["id_"]) for event in outcome["events"]]
        lost += len({event["id"] for event in logged} - set(got))
        duplicated += len(got) - len(set(got))
        mismatched += sum(1 for event in outcome["events"]
                          if {key: value for key, value in event.items() if key != "id_"} != logged[int(event["id_"]) - 1])
        events += len(got)
    report = {
        "benchmark": "serve_load", "topology": "topologies/fanout_qa.yaml", "model": "embedded (SmolLM2-135M, fp32, CPU)",
        "submitted": args.runs, "accepted": len(accepted), "refused_429": len(refused), "other_status": other,
        "first_refused_submission": first_refused,
        "retry_after_seconds": sorted(set(refused)), "max_concurrent": args.max_concurrent, "max_queue": args.max_queue,
        "clients": args.clients, "slow_clients": args.slow_clients, "slow_ms_per_event": args.slow_ms,
        "peak_open_streams": peak_streams, "runs_followed": len(results), "final_statuses": statuses,
        "events_received": events, "events_lost": lost, "events_duplicated": duplicated,
        "events_differing_from_log": mismatched,
        "reconnects": sum(outcome["reconnects"] for outcome in results),
        "seconds": round(seconds, 1), "runs_per_minute": round(60 * len(accepted) / seconds, 1),
        "rss_after_warmup_mib": round(baseline / 2**20), "rss_peak_mib": round(max(sampler.peak, baseline) / 2**20),
        "rss_growth_mib": round((max(sampler.peak, baseline) - baseline) / 2**20), "rss_samples": sampler.samples,
        "cpu_count": os.cpu_count(), "runs_dir": str(runs_dir),
    }
    print(json.dumps(report, indent=2))
    ok = (not other and len(accepted) + len(refused) == args.runs and statuses == {"finished": len(accepted)}
          and lost == duplicated == mismatched == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
