"""What people use from a terminal: the `rclc-graph` command (cli.py; its consoles, errors and
exit codes in console.py, its `--input` files in run_inputs.py), interactive runs with a
progress view and Ctrl-C handling (interactive.py), and the terminal tables (terminal.py).

The top layer: it may import every other layer, but from the executors only what
`rclc_graph.executors` exports (an import-linter contract in pyproject.toml checks it).
"""
