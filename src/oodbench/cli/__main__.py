"""`python -m oodbench.cli …` runs the `oodbench` command (as `python -m oodbench` does)."""

from .main import main

if __name__ == "__main__":
    main()
