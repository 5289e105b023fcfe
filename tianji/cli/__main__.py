"""``python -m tianji.cli``: the same as ``tianji`` / ``python -m tianji``."""

import sys

from tianji.cli import main

sys.exit(main())
