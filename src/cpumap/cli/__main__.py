"""``python -m cpumap.cli``: the same as the ``cpumap`` command."""

import sys

from cpumap.cli.app import main

sys.exit(main())
