import sys

from services.cli import main

sys.exit(main(["serve", "notify", *sys.argv[1:]]))
