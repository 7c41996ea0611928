import sys

from mcfl.apps.cli import main

sys.exit(main())
