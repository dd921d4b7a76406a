"""`python -m oodbench …` runs the `oodbench` command."""

from .cli import main

if __name__ == "__main__":
    main()
