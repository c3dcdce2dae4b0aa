"""`python -m rankscope.capture.calibrate ...` (under torchrun): the `rankscope calibrate` command. The
entry point, not the library, is what imports the CLI."""
import sys

from rankscope.cli import main

main(["calibrate", *sys.argv[1:]], prog_name="rankscope calibrate")
