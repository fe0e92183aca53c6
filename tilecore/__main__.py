import sys

from tilecore.cli import main

sys.exit(main())
