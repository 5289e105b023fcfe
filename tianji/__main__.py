"""``python -m tianji`` is the ``tianji`` command."""

import sys

from tianji.cli import main

sys.exit(main())
