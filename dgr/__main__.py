import sys

from dgr.cli import main

sys.exit(main())
