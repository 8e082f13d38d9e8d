"""`python -m kernopt`: the command line (kernopt/cli.py). Imports cli."""
import sys
from kernopt.cli import main

if __name__ == "__main__": sys.exit(main())
