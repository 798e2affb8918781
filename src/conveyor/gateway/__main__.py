"""`python -m conveyor.gateway --config C --port P`: the gateway command without the full CLI."""

from __future__ import annotations

import sys

import typer

from conveyor.gateway.cli import register


def main() -> None:
    """Run the `gateway` command as this module's only command."""
    app = typer.Typer(add_completion=False)
    register(app)

    @app.callback()
    def _root() -> None:
        """Conveyor's recording gateway."""

    app(["gateway", *sys.argv[1:]])


if __name__ == "__main__":
    main()
