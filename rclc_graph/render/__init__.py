"""Pure renderers: plans and run records to text people read (report.html, SVG, Mermaid, PNG,
sizes and durations).

They read plain data (record dicts, or plans and blueprints by their attributes) and import
no other part of the graph layer, so the run record can write its report.html (run/) and the
CLI can draw and print (views/) with the same code. matplotlib loads only for PNGs.
"""

from .drawing import Sketch, save_png, sketch_blueprint, sketch_plan, sketch_record, to_mermaid, to_svg
from .html_report import kept_prompt_tokens, marked_prompt, render_report
from .terminal_text import printable, printable_data, printable_line
from .progress_lines import StepEstimate
from .units import format_bytes, format_duration, format_seconds

__all__ = [
    # drawings
    "Sketch",
    "save_png",
    "sketch_blueprint",
    "sketch_plan",
    "sketch_record",
    "to_mermaid",
    "to_svg",
    # report.html
    "kept_prompt_tokens",
    "marked_prompt",
    "render_report",
    # text for terminals
    "printable",
    "printable_data",
    "printable_line",
    # units
    "format_bytes",
    "format_duration",
    "format_seconds",
    # progress lines for logs and pipes
    "StepEstimate",
]
