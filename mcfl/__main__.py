import sys

from mcfl.cli import main

sys.exit(main())
