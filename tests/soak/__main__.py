import sys

from tests.soak.driver import main

sys.exit(main())
