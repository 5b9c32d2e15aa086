import sys

from ravenproxy.cli import main

sys.exit(main())
