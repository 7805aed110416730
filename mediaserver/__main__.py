import sys

from mediaserver.cli import main

sys.exit(main())
