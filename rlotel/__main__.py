"""`python -m rlotel ...`: the `rlotel` command line, for an environment whose scripts
directory is not on PATH."""

import sys

from rlotel.cli.commands import main

if __name__ == "__main__":
    sys.exit(main())
