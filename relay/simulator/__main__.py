import sys

from relay.simulator.cli import main

sys.exit(main())
