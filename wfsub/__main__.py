"""`python -m wfsub`: the `wfsub` command."""

from .cli import main

main(prog_name="wfsub")
