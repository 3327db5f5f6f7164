"""`python -m stashd`: versions, the socket, whether the daemon answers, its stats (doctor.py)."""

import sys

from stashd.doctor import main

sys.exit(main())
