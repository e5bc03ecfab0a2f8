import sys

from services.cli import main

sys.exit(main(["serve", "media", *sys.argv[1:]]))
