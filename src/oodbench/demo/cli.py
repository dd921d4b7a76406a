"""`oodbench demo`: the embedded end-to-end demo on scikit-learn's digits."""

from __future__ import annotations

from pathlib import Path

import typer

__all__ = ["demo_command", "register"]


def demo_command(
    out: Path = typer.Option(Path("oodbench-demo"), "--out", help="Output directory."),
    seed: int = typer.Option(0, help="Random seed (training and data split)."),
    progress: bool = typer.Option(True, help="Show progress bars."),
) -> None:
    """Run the embedded end-to-end demo on scikit-learn's digits (offline; 3 minutes on 2 busy cores).

    Example:
      oodbench demo --out oodbench-demo
    """
    from .run import print_summary, run_demo

    result = run_demo(out, seed, progress=progress)
    print_summary(result)


def register(main: typer.Typer) -> None:
    """Add `oodbench demo` to the main CLI."""
    main.command("demo")(demo_command)
