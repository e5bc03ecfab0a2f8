import sys

from services.console.app import main

sys.exit(main())
