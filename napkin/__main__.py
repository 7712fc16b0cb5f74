"""``python -m napkin``: the same command line as the ``napkin`` console script."""

from .cli import main

if __name__ == "__main__":
    main()
