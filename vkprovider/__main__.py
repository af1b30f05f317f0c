"""``python -m vkprovider`` is the ``vkprovider`` command."""

import sys

from vkprovider.cli import main

sys.exit(main())
