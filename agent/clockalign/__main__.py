"""python -m clockalign: the same as the clockalign command."""
import sys

from .cli.main import main

sys.exit(main())
