"""``python -m riqr`` is the ``riqr`` command."""

import sys

from riqr.cli import main

sys.exit(main())
