"""`python -m bench <name> [options]`: a benchmark written as a Django command (the `Command` of bench/<name>.py; its
options, --help and output are the command's), with Django set up from DJANGO_SETTINGS_MODULE (default
config.settings, as manage.py). `python -m bench` alone lists them."""

import importlib
import os
import sys

COMMANDS = (
    "scheduler",
    "preview",
    "metering",
    "execution",
    "in_band",
    "gateway",
    "gang",
    "start_accuracy_slurm",
    "gang_replay",
)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m bench {{{','.join(COMMANDS)}}} [options]   (--help after a name for its options)")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    command = importlib.import_module(f"bench.{argv[0]}").Command()
    command.run_from_argv(["python -m bench", argv[0], *argv[1:]])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
