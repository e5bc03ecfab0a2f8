import sys

from services.cli import main

sys.exit(main(["serve", "creation", *sys.argv[1:]]))
