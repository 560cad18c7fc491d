import sys

from rlotel.cli.commands import main

sys.exit(main())
