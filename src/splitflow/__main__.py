import sys

from splitflow.cli import main

sys.exit(main())
