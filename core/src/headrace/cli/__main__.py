"""``python -m headrace.cli``: the ``headrace`` command."""

import sys

from headrace.cli import main

sys.exit(main())
