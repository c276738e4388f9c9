"""`python -m tuner` is the `tunefarm` command."""

from tuner.cli import main

main()
