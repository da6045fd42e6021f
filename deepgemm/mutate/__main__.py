"""`python -m deepgemm.mutate ...`: the same as `python -m deepgemm mutate ...`."""
import sys

from deepgemm.mutate.cli import main

sys.exit(main())
