"""`rclc-graph`: run, validate, draw and inspect topologies from a terminal.

Exit codes: 0 success; 1 a run failed or `validate` found problems; 2 a usage error (bad
option, missing or malformed file, invalid topology or inputs for `run`/`draw`); 3 the run
waits for a person's answer (`resume --answer NODE=TEXT` continues it); 130 the run was
interrupted with Ctrl-C (the nodes that finished are recorded).

User mistakes never print a traceback: GraphError and ValueError become one message plus
the fix. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import anyio
import typer
from rich.console import Console
from rich.text import Text

from rclc.files import write_atomic

from ..errors import ExecutorUnavailable, GraphError, UsageError
from ..executors import (
    ModelPool,
    check_options,
    default_pool,
    executor_kind,
    executor_names,
    make_executor,
    parse_pins,
    parse_replicas,
)
from ..experiments import commands as experiment_commands
from ..experiments.commands import UsageCommand
from ..plan import Plan, plan_file
from ..plan.input_checks import DEFAULT_MAX_INPUT_BYTES
from ..render import format_duration, printable, printable_line, save_png, sketch_blueprint, sketch_plan, to_mermaid
from ..run import RunSettings, current_record, preflight, read_resume_point
from ..server import commands as server_commands
from ..spec import json_schema, read_graph
from .console import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_WAITING,
    fail,
    parse_answers,
    print_graph_error,
    stderr_console,
    stdout_console,
    usage_error,
    write_json,
)
from .interactive import execute, execute_resume
from .out_dir import check_out_dir
from .run_inputs import read_inputs
from .node_view import render_node
from .terminal import render_record
from .topology_checks import check_topology, checked_blueprint, drawable_plan, trust_note

app = typer.Typer(
    name="rclc-graph",
    help="Multi-agent graphs whose agents hand each other compressed state. "
    "Start with: rclc-graph run topologies/chain_of_agents.yaml --input examples/inputs/chain_of_agents.json",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

app.add_typer(experiment_commands.app)  # experiment, data, compare-runs at the top level
server_commands.register(app)  # serve (starlette and uvicorn load when it runs)


def _version(value: bool) -> None:
    if value:
        import rclc  # torch-free

        try:
            version = importlib.metadata.version("rclc-graph")
        except importlib.metadata.PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
            version = f"{rclc.__version__} (not installed)"
        typer.echo(f"rclc-graph {version}, rclc {rclc.__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="print the versions of rclc-graph and rclc, and exit"),
) -> None:
    """Multi-agent graphs whose agents hand each other compressed state. Start with:
    rclc-graph run topologies/chain_of_agents.yaml --input examples/inputs/chain_of_agents.json"""

MAX_INPUT_BYTES_OPTION = typer.Option(
    DEFAULT_MAX_INPUT_BYTES, "--max-input-bytes", min=1, metavar="BYTES",
    help="refuse runs whose inputs hold more text than this, before anything is tokenized",
)


# -- inputs ------------------------------------------------------------------------------------


def _plans(
    topology: Path,
    runs: list[tuple[str, dict[str, Any]]],
    trust_code: bool,
    max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES,
    answers: dict[str, str] | None = None,
) -> list[Plan]:
    plans = []
    for label, inputs in runs:
        try:
            plans.append(
                plan_file(topology, inputs, trust_code=trust_code, max_input_bytes=max_input_bytes, answers=answers)
            )
        except GraphError as error:
            if len(runs) > 1:
                stderr_console().print(Text(f"in the inputs of {label}:", style="bold"))
            raise error
    return plans


# -- run ---------------------------------------------------------------------------------------


def _summary(record: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    return {
        "run_id": record["run_id"],
        "status": record["status"],
        "error": record["error"],
        "failed_node": record["failed_node"],
        "run_dir": str(run_dir),
        "record": str(run_dir / "record.json"),
        "report": str(run_dir / "report.html"),
        "seconds": record["timings"]["seconds"],
        "outputs": record["outputs"],
        "hops": record["hops"],
        "lineage": record["lineage"],
        "unfinished": record["unfinished"],
        "skipped": record.get("skipped", {}),
        "waiting": record.get("waiting", []),
    }


def _preflight(topology: Path, plans: list[Plan], pool: ModelPool) -> None:
    """Prompts that cannot fit their context and trusted code that does not import, refused
    with the YAML line before any weights load."""
    for plan in plans:
        try:
            preflight(plan, pool, topology.resolve().parent)
        except GraphError as error:
            raise error.with_locations(read_graph(topology, trusted=plan.trust_code).locate) from None


def _show_result(console: Console, record: dict[str, Any], run_dir: Path, interrupted: bool, json_output: bool) -> int:
    """Print a recorded run (JSON summary or tables); the exit code it calls for (130 raises)."""
    if json_output:
        sys.stdout.write(json.dumps(_summary(record, run_dir), ensure_ascii=False) + "\n")
        sys.stdout.flush()
    else:
        console.print()
        render_record(console, record, str(run_dir))
        console.print(Text("inspect ", style="bold") + Text(f"rclc-graph inspect {run_dir}"))
    if interrupted:
        if not json_output:
            finished = ", ".join(record["nodes"]) or "none"
            console.print(Text(f"interrupted; finished nodes: {finished}", style="yellow"))
            console.print(Text(f"continue it with: rclc-graph resume {run_dir}", style="yellow"))
        raise typer.Exit(EXIT_INTERRUPTED)
    if record["status"] == "waiting":
        return EXIT_WAITING
    return 0 if record["status"] == "finished" else EXIT_FAILED


def _introduce(console: Console, plans: list[Plan], input: Path, out: Path) -> None:
    plan = plans[0]
    head = Text(plan.name, style="bold")
    if plan.spec.description:
        head.append(f": {printable_line(plan.spec.description)}")
    console.print(head)
    runs = f"; {len(plans)} runs from {input}" if len(plans) > 1 else ""
    states = sum(1 for edge in plan.edges if edge.policy.mode != "text")
    handoffs = _count(len(plan.edges), "handoff") + (f" ({states} hand over state)" if states else "")
    console.print(Text(printable(f"{_count(len(plan.nodes), 'node')}, {handoffs}{runs}; recording to {out}/"), style="dim"))


def _count(number: int, word: str) -> str:
    return f"{number} {word}" + ("" if number == 1 else "s")


@app.command(cls=UsageCommand)
def run(  # a typer command: each option is a parameter (docs/cli.md lists them)
    topology: Path = typer.Argument(..., help="topology YAML file", show_default=False, metavar="TOPOLOGY"),
    input: Path = typer.Option(..., "--input", "-i", metavar="FILE",
                               help=".json (one run) or .jsonl (one run per line) of inputs; - reads stdin"),
    out: Path = typer.Option(Path("runs"), "--out", "-o", metavar="DIR", help="directory that receives runs/<run_id>/"),
    json_output: bool = typer.Option(False, "--json", help="print a JSON summary per run instead of tables"),
    trust_code: bool = typer.Option(False, "--trust-code", help="allow module:function selectors and methods"),
    seed: int = typer.Option(0, "--seed", metavar="N", help="run seed (sampling nodes derive theirs from it)"),
    answer: list[str] = typer.Option(
        [], "--answer", "-a", metavar="NODE=TEXT", help="answer a node's interrupt up front (repeatable)"
    ),
    executor_name: str = typer.Option(
        "local", "--executor", "-e", metavar="NAME",
        help="where nodes run: " + ", ".join(f"{kind.name} ({kind.description})" for kind in map(executor_kind, executor_names())),
    ),
    address: Optional[str] = typer.Option(
        None, "--address", metavar="ADDR", help="Ray cluster to join: auto, or HOST:PORT of the head (default: a private local Ray)"
    ),
    pin: list[str] = typer.Option(
        [], "--pin", metavar="NODE=REPLICA", help="NODE=REPLICA: run a node on that replica of its model (ray; repeatable)"
    ),
    replicas: list[str] = typer.Option(
        [], "--replicas", metavar="MODEL=N", help="MODEL=N: start N replicas of a model, overriding the topology (ray; repeatable)"
    ),
    max_input_bytes: int = MAX_INPUT_BYTES_OPTION,
    max_batch: Optional[int] = typer.Option(
        None, "--max-batch", min=1, metavar="N",
        help="sequences a model decodes together at most (default: the topology's, else 32)",
    ),
) -> None:
    """Run a topology on inputs; record it under --out and print outputs, hops and lineage."""
    console = stdout_console()
    try:
        check_out_dir(out)
        runs = read_inputs(input, max_input_bytes=max_input_bytes)
        plans = _plans(topology, runs, trust_code, max_input_bytes, parse_answers(answer))
        executor_options = {"address": address, "pins": parse_pins(pin), "replicas": parse_replicas(replicas),
                            "max_batch": max_batch}
        check_options(executor_name, executor_options)  # which executor takes which flag: the registry says
    except (GraphError, ValueError) as error:
        usage_error(error)
    pool = default_pool()
    try:
        _preflight(topology, plans, pool)
    except (GraphError, ValueError, OSError) as error:
        usage_error(error)
    if not json_output:
        _introduce(console, plans, input, out)
    try:
        executor = make_executor(executor_name, pool=pool, **executor_options)
    except ExecutorUnavailable as error:
        fail(error.reason, f"install it: {error.install}")
    except ValueError as error:
        usage_error(error)
    settings = RunSettings(pool, executor, topology.resolve().parent, owns_executor=True)  # this command's runs share it
    status = 0
    try:
        _prepare(settings, plans[0], console, json_output)
        for index, ((label, _inputs), plan) in enumerate(zip(runs, plans)):
            if len(plans) > 1 and not json_output:
                console.rule(Text(printable(f"run {index + 1} of {len(plans)}: {label}")))
            record, run_dir, interrupted = anyio.run(
                lambda plan=plan: execute(plan, settings, out=out, seed=seed, topology=topology, console=console,
                                          quiet=json_output)
            )
            executor.release(record["run_id"])  # recorded: its agents live on in snapshots
            status = max(status, _show_result(console, record, run_dir, interrupted, json_output))
    except KeyboardInterrupt:  # Ctrl-C outside a run (model loading): nothing to record
        stderr_console().print(Text("interrupted", style="yellow"))
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except (GraphError, ValueError, NotImplementedError, OSError) as error:
        usage_error(error)
    finally:
        settings.close()
    if status:
        raise typer.Exit(status)


def _prepare(settings: RunSettings, plan: Plan, console: Console, quiet: bool) -> None:
    """Load the plan's models (start the executor's replicas) before the run starts, so
    progress shows the run, not the load. (The command preflighted every plan already.)"""
    executor = settings.executor
    label = executor.preparing(plan)
    if quiet or not label:
        anyio.run(executor.prepare, plan, settings.base_dir)
        return
    started = time.monotonic()
    if console.is_terminal:
        with console.status(label + " …"):
            hosts = anyio.run(executor.prepare, plan, settings.base_dir)
    else:  # a log or a pipe: a line before the wait, and one after it (a first load converts the model)
        console.print(Text(label + " …", style="dim"))
        hosts = anyio.run(executor.prepare, plan, settings.base_dir)
    for host in hosts:
        console.print(Text(f"  {host['replica']} on node {host['node'][:12]}", style="dim"))
    console.print(Text(f"  ready in {format_duration(time.monotonic() - started)}", style="dim"))


# -- resume ------------------------------------------------------------------------------------


@app.command(cls=UsageCommand)
def resume(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR",
                                   help="the directory of an interrupted run, e.g. runs/20250101-120000-abc123",
                                   show_default=False),
    json_output: bool = typer.Option(False, "--json", help="print a JSON summary instead of tables"),
    trust_code: bool = typer.Option(
        False, "--trust-code",
        help="needed when the run imports code and was not started with --trust-code by you on this machine",
    ),
    answer: list[str] = typer.Option(
        [], "--answer", "-a", metavar="NODE=TEXT", help="answer a node the run waits for (repeatable)"
    ),
) -> None:
    """Continue a crashed, cancelled, failed or waiting run: finished nodes are kept, the rest runs."""
    console = stdout_console()
    try:
        answers = parse_answers(answer)
        point = read_resume_point(run_dir, trust_code=trust_code, answers=answers)
    except ValueError as error:
        usage_error(error)
    pool = default_pool()
    if not json_output:
        remaining = ", ".join(point.remaining) or "none"
        console.print(Text(f"resuming {point.run_id} ({point.plan.name}): {len(point.finished)} of "
                           f"{len(point.plan.nodes)} nodes finished before; to run: {remaining}", style="dim"))
    loading = RunSettings.build(pool=pool, base_dir=point.base_dir)  # loads the models here, so progress shows it
    try:
        _prepare(loading, point.plan, console, json_output)
    except KeyboardInterrupt:
        stderr_console().print(Text("interrupted", style="yellow"))
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except (GraphError, ValueError, OSError) as error:
        usage_error(error)
    finally:
        loading.close()  # the pool keeps the models for the resume
    try:
        record, directory, interrupted = anyio.run(
            lambda: execute_resume(point, pool=pool, console=console, quiet=json_output, trust_code=trust_code,
                                   answers=answers)
        )
    except KeyboardInterrupt:  # Ctrl-C while models load: nothing was written
        stderr_console().print(Text("interrupted", style="yellow"))
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except (GraphError, ValueError, NotImplementedError, OSError) as error:
        usage_error(error)
    status = _show_result(console, record, directory, interrupted, json_output)
    if status:
        raise typer.Exit(status)


# -- validate ----------------------------------------------------------------------------------


@app.command(cls=UsageCommand)
def validate(
    topology: Path = typer.Argument(..., help="topology YAML file", show_default=False, metavar="TOPOLOGY"),
    input: Optional[Path] = typer.Option(None, "--input", "-i", metavar="FILE",
                                         help="also plan it for these inputs (.json/.jsonl, - for stdin)"),
    trust_code: bool = typer.Option(False, "--trust-code", help="allow module:function selectors and methods"),
    check_imports: bool = typer.Option(
        False, "--check-imports", help="import the code the topology names, as run does (needs --trust-code)"
    ),
    json_output: bool = typer.Option(False, "--json", help="print the plan (or the problems) as JSON"),
    max_input_bytes: int = MAX_INPUT_BYTES_OPTION,
) -> None:
    """Check a topology (and optionally inputs) without running anything. Exit 1 on problems.

    Imports nothing unless --check-imports (with --trust-code); code the topology names is
    checked as names, and `run` will need --trust-code for it. With --input, also plans it
    for those inputs and checks each prompt against its model's context (tokenizers only)."""
    console = stdout_console()

    def failing(label: str) -> None:
        if len(runs) > 1:
            stderr_console().print(Text(f"in the inputs of {label}:", style="bold"))

    runs: list[tuple[str, dict[str, Any]]] = []
    try:
        runs = read_inputs(input, max_input_bytes=max_input_bytes) if input is not None else []
        check = check_topology(topology, runs, trust_code=trust_code, check_imports=check_imports,
                               max_input_bytes=max_input_bytes, pool=default_pool(), failing=failing)
    except GraphError as error:
        if json_output:
            write_json({"valid": False, "problems": [problem.to_dict() for problem in error.problems]})
        else:
            print_graph_error(stderr_console(), error)
        raise typer.Exit(EXIT_FAILED) from None
    except ValueError as error:
        usage_error(error)
    if json_output:
        write_json(check.to_dict())
        return
    spec = check.blueprint.spec
    outputs = [node.name for node in spec.nodes if node.output]
    line = Text("✓ ", style="green")
    line.append(printable(topology), style="bold")
    line.append(f" is valid: graph {spec.name}, {_count(len(spec.nodes), 'node')}, {_count(len(spec.edges), 'edge')}, "
                f"outputs: {', '.join(outputs)}")
    console.print(line)
    note = trust_note(check)
    if note is not None:
        console.print(Text(f"  {printable(note)}", style="yellow"))
    elif check_imports:
        console.print(Text("  every module:function it names imports", style="dim"))
    for (label, _), plan in zip(runs, check.plans):
        console.print(Text(f"  {printable(label)}: plan of {_count(len(plan.nodes), 'node')}, {_count(len(plan.edges), 'handoff')}, "
                           f"{_count(len(plan.levels()), 'level')}; fingerprint {plan.fingerprint()[:12]}"))


# -- draw --------------------------------------------------------------------------------------


class DrawFormat(str, Enum):
    mermaid = "mermaid"
    png = "png"


@app.command(cls=UsageCommand)
def draw(
    topology: Path = typer.Argument(..., help="topology YAML file", show_default=False, metavar="TOPOLOGY"),
    format: DrawFormat = typer.Option(DrawFormat.mermaid, "--format", "-f", help="mermaid text or a PNG image"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", metavar="FILE", help="file to write (default: stdout for mermaid, "
                                       "<topology>.png for png)"),
    input: Optional[Path] = typer.Option(None, "--input", "-i", metavar="FILE", help="draw the plan for these inputs (.json): "
                                         "every foreach copy and loop round"),
    trust_code: bool = typer.Option(False, "--trust-code", help="read profile files outside the topology's directory"),
    max_input_bytes: int = MAX_INPUT_BYTES_OPTION,
) -> None:
    """Draw a topology: Mermaid flowchart text, or an offline PNG (matplotlib). Imports nothing."""
    try:
        if input is not None:
            runs = read_inputs(input, max_input_bytes=max_input_bytes)
            sketch = sketch_plan(drawable_plan(topology, runs[0][1], trust_code, max_input_bytes))
        else:
            sketch = sketch_blueprint(checked_blueprint(topology, trust_code)[0])
    except (GraphError, ValueError) as error:
        usage_error(error)
    if format is DrawFormat.mermaid:
        text = to_mermaid(sketch)
        if out is None:
            sys.stdout.write(text)
            return
        try:
            write_atomic(out, text.encode("utf-8"))
        except OSError as error:
            fail(f"--out: cannot write {str(out)!r}: {error.strerror}", "pass a writable path")
    else:
        out = out if out is not None else Path(topology.stem + ".png")
        try:
            save_png(sketch, out)
        except OSError as error:
            fail(f"--out: cannot write {str(out)!r}: {error.strerror}", "pass a writable path")
    stderr_console().print(Text(f"wrote {out}"))


# -- inspect -----------------------------------------------------------------------------------


@app.command(cls=UsageCommand)
def inspect(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="a run directory, e.g. runs/20250101-120000-abc123",
                                   show_default=False),
    json_output: bool = typer.Option(False, "--json", help="print the whole record (as inspect reads it: a killed "
                                     "run as crashed, with its finished nodes)"),
    node: Optional[str] = typer.Option(
        None, "--node", "-n", metavar="NAME",
        help="show only this node: what it is, its status, edges, handoffs, tool calls, prompt, output and lineage",
    ),
) -> None:
    """Show a recorded run: status, outputs, per-hop figures and the lineage of every node."""
    try:
        record = current_record(run_dir)  # a killed run shows as crashed, with what finished
        if json_output:
            write_json(record if node is None else _node_data(record, node))
            return
        if node is not None:
            render_node(stdout_console(), record, node, str(run_dir))
            return
        render_record(stdout_console(), record, str(run_dir), every_node=True)
    except ValueError as error:
        usage_error(error)


def _node_data(record: dict[str, Any], name: str) -> dict[str, Any]:
    """`inspect --node NAME --json`: the node's plan entry, status and result."""
    plan_nodes = {node.get("name"): node for node in (record.get("plan") or {}).get("nodes") or []}
    if name not in plan_nodes:
        raise UsageError(f"node: the run has no node {name!r}; its nodes: {', '.join(map(str, plan_nodes)) or 'none'}")
    return {"node": name, "status": (record.get("node_status") or {}).get(name), "plan": plan_nodes[name],
            "skipped": (record.get("skipped") or {}).get(name),
            "waiting": [item for item in record.get("waiting") or [] if item.get("node") == name],
            "answer": (record.get("answers") or {}).get(name),
            "hops": [hop for hop in record.get("hops") or [] if name in (hop.get("source"), hop.get("target"))],
            "result": (record.get("nodes") or {}).get(name)}


# -- schema ------------------------------------------------------------------------------------


class SchemaKind(str, Enum):
    topology = "topology"
    agent = "agent"
    model = "model"


@app.command(cls=UsageCommand)
def schema(
    kind: SchemaKind = typer.Option(SchemaKind.topology, "--kind", "-k", help="which file's schema"),
) -> None:
    """Print the JSON Schema of topology, agent or model files (for editor completion)."""
    write_json(json_schema(kind.value))



def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit code (also used by tests)."""
    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name="rclc-graph", standalone_mode=True)
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


if __name__ == "__main__":  # `python -m rclc_graph.views.cli`; `python -m rclc_graph` is the short form
    sys.exit(main())
