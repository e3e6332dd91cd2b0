"""``python -m racer_rs``: the ``racer`` command line."""

import sys

from racer_rs.cli import main

if __name__ == "__main__":
    sys.exit(main())
