import sys

from autoresponse.supervisors.cli import main

sys.exit(main())
