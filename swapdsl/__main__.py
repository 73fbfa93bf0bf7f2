import sys

from swapdsl.cli import main

sys.exit(main())
