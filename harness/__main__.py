import sys

from retrylab.entry import main

sys.exit(main())
