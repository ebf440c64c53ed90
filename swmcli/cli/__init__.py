"""The top floor: the `swm` command line (``app.py``) and how its options are built from the
config fields (``options.py``). It parses, imports the one command it runs, and renders."""

from swmcli.cli.app import app, main

__all__ = ["app", "main"]
