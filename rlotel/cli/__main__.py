"""`python -m rlotel.cli ...`: the same as `python -m rlotel` and `rlotel`."""

import sys

from rlotel.cli.commands import main

if __name__ == "__main__":
    sys.exit(main())
