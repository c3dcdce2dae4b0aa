"""`python -m rankscope.cli ...`: the `rankscope` command."""
from rankscope.cli import main

main()
