import sys

from swapdsl.entry import main

sys.exit(main())
