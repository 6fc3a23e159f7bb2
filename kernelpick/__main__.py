"""``python -m kernelpick`` is the ``kernelpick`` command."""

import sys

from kernelpick.cli import main

sys.exit(main())
