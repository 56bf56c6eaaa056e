"""Concurrent first requests to a fresh server process (issue 24 item 3): two requests at once
to a server that had not imported transformers yet got `ImportError: cannot import name
'AutoConfig'` (500). The server now imports its model stack before it takes a request."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.paths import ROOT

pytestmark = pytest.mark.integration


SCRIPT = textwrap.dedent('''
    import sys, threading, time
    sys.path.insert(0, {root!r})
    assert "transformers" not in sys.modules
    import httpx, uvicorn
    from rclc_graph.server import ServerSettings, create_app
    from tests.helpers.servers import PAIR_INPUTS, listening_socket, write_topologies
    from pathlib import Path
    directory = Path({directory!r})
    write_topologies(directory)
    assert "transformers" not in sys.modules  # nothing imported it yet: the race is possible
    sock = listening_socket()
    port = sock.getsockname()[1]
    settings = ServerSettings(runs_dir=directory / "runs", topologies_dir=directory / "topologies", port=port)
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={{"sockets": [sock]}}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    assert "transformers.models.auto.configuration_auto" in sys.modules and "rclc.pipeline" in sys.modules
    answers = [None, None]
    barrier = threading.Barrier(2)
    def post(index):
        with httpx.Client(base_url=f"http://127.0.0.1:{{port}}", timeout=120) as client:
            barrier.wait()
            answers[index] = client.post("/runs", json={{"topology": "pair", "inputs": PAIR_INPUTS}})
    posts = [threading.Thread(target=post, args=(index,)) for index in range(2)]
    for each in posts: each.start()
    for each in posts: each.join()
    assert [answer.status_code for answer in answers] == [202, 202], [answer.text for answer in answers]
    server.should_exit = True
    thread.join(60)
    print("ok")
''')


# issue 24 item 3
def test_two_first_requests_to_a_fresh_server_both_succeed(tmp_path):
    script = SCRIPT.format(root=str(ROOT), directory=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-4000:]
