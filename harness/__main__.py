import sys

from retrylab.cli import main

sys.exit(main())
