"""oodbench tests: tests/<area>/ mirrors src/oodbench/<area>/."""
