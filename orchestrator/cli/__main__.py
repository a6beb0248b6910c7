import sys

from orchestrator.cli import main

# Guarded: multiprocessing may import the main module again in a child (a forkserver's
# preload of "__main__", a spawn), where it must not run the command a second time.
if __name__ == "__main__":
    sys.exit(main())
