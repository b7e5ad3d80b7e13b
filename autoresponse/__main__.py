import sys

from autoresponse.cli import main

sys.exit(main())
