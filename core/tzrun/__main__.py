"""``python -m tzrun`` is the ``tzrec-run`` command (so ``torchrun -m tzrun train ...`` works)."""

from tzrun.cli.main import console_main

if __name__ == "__main__":
    console_main()
